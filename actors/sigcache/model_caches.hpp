// model_caches: where each model's signature cache lives on disk and how it is opened
// (open_model_caches and stored_current_set, declared in actors/sigcache/sigcache_actor.hpp, are
// defined in model_caches.cpp). Plain functions: no actor system.
#pragma once

#include <string>

namespace eldr {

// A model's directory name: its name with every byte outside [A-Za-z0-9_-] written %XX, so that
// names like "Qwen/Qwen3-30B-A3B" or ".." stay one directory under data_dir/models.
std::string model_dir_name(const std::string& name);

}  // namespace eldr
