"""A progress report on stderr: a bar redrawn in place on a terminal, plain lines otherwise.

On a tty the bar is redrawn at most every `interval` seconds; into a file or pipe (CI logs) a line
is printed each time another tenth of the work is done, so logs stay short and readable. The
clock is injectable for tests.
"""
import sys
import time


class Progress:
    def __init__(self, total, done=0, stream=None, tty=None, clock=time.monotonic,
                 interval=0.1, width=30):
        self.total = total
        self.done = done
        self.failed = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.interval = interval
        self.width = width
        self.start = clock()
        self.start_done = done
        self._last_draw = None
        self._last_decile = self._decile()
        self._drawn = False

    def _decile(self):
        return (10 * self.done) // self.total if self.total else 10

    def line(self):
        pct = 100.0 * self.done / self.total if self.total else 100.0
        filled = int(self.width * self.done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = self.clock() - self.start
        fresh = self.done - self.start_done
        rate = fresh / elapsed if elapsed > 0 else 0.0
        text = "[%s] %d/%d prompts %5.1f%%" % (bar, self.done, self.total, pct)
        if rate > 0:
            left = (self.total - self.done) / rate
            text += "  %.2f/s  eta %s" % (rate, _clock_text(left))
        if self.failed:
            text += "  %d failed" % self.failed
        return text

    def advance(self, ok=True):
        if ok:
            self.done += 1
        else:
            self.failed += 1
        self.draw()

    def draw(self, force=False):
        now = self.clock()
        if self.tty:
            if force or self._last_draw is None or now - self._last_draw >= self.interval \
                    or self.done == self.total:
                self.stream.write("\r" + self.line() + "\x1b[K")
                self.stream.flush()
                self._last_draw = now
                self._drawn = True
        else:
            decile = self._decile()
            if force or decile > self._last_decile:
                self.stream.write(self.line() + "\n")
                self.stream.flush()
                self._last_decile = decile

    def finish(self):
        """Ends the bar's line so that later messages start on their own line."""
        if self.tty and self._drawn:
            self.stream.write("\r" + self.line() + "\x1b[K\n")
            self.stream.flush()
            self._drawn = False

    def message(self, text):
        """Prints text on its own line without breaking the bar."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        if self.tty and self._drawn:
            self.stream.write(self.line() + "\x1b[K")
        self.stream.flush()


def _clock_text(seconds):
    seconds = int(seconds + 0.5)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "%d:%02d:%02d" % (h, m, s) if h else "%d:%02d" % (m, s)
