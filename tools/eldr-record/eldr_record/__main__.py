import sys

from .recorder import main

sys.exit(main())
