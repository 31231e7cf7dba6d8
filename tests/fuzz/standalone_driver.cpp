// A deterministic stand-in for libFuzzer's driver, used when the fuzz targets are built without
// clang's -fsanitize=fuzzer. It replays every file of the given corpus folders, then feeds
// --runs mutated inputs (bit flips, byte inserts and deletes, splices, random bytes) from a seeded
// generator. A crash or sanitizer report fails the test; the seed makes any failure reproducible.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using bytes = std::vector<uint8_t>;

bytes mutate(const bytes& in, const std::vector<bytes>& pool, std::mt19937_64& rng) {
  bytes out = in;
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!out.empty()) out[rng() % out.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:  // set an interesting byte
        if (!out.empty()) {
          static const uint8_t interesting[] = {0x00, 0x7f, 0x80, 0xc0, 0xc1, 0xd9, 0xdc, 0xdd,
                                                0xde, 0xdf, 0xc4, 0xc6, 0xce, 0xcf, 0xff, 0x90};
          out[rng() % out.size()] = interesting[rng() % sizeof(interesting)];
        }
        break;
      case 2:  // insert random bytes
        for (int k = static_cast<int>(rng() % 8); k >= 0; --k)
          out.insert(
              out.begin() + static_cast<std::ptrdiff_t>(out.empty() ? 0 : rng() % out.size()),
              static_cast<uint8_t>(rng()));
        break;
      case 3:  // delete a range
        if (!out.empty()) {
          const size_t at = rng() % out.size();
          const size_t len = std::min<size_t>(out.size() - at, 1 + rng() % 16);
          out.erase(out.begin() + static_cast<std::ptrdiff_t>(at),
                    out.begin() + static_cast<std::ptrdiff_t>(at + len));
        }
        break;
      case 4:  // truncate
        if (!out.empty()) out.resize(rng() % out.size());
        break;
      default:  // splice with another corpus entry
        if (!pool.empty()) {
          const bytes& other = pool[rng() % pool.size()];
          const size_t cut = out.empty() ? 0 : rng() % out.size();
          out.resize(cut);
          if (!other.empty()) {
            const size_t from = rng() % other.size();
            out.insert(out.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
          }
        }
        break;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 10000;
  uint64_t seed = 1;
  std::vector<bytes> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--runs=", 0) == 0) {
      runs = std::stol(arg.substr(7));
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::stoull(arg.substr(7));
    } else {
      std::error_code ec;
      if (!std::filesystem::is_directory(arg, ec)) continue;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        std::ifstream f(entry.path(), std::ios::binary);
        corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      }
    }
  }
  for (const bytes& b : corpus)
    LLVMFuzzerTestOneInput(b.data(), b.size());
  std::mt19937_64 rng(seed);
  for (long r = 0; r < runs; ++r) {
    bytes input;
    if (corpus.empty() || rng() % 10 == 0) {
      input.resize(rng() % 256);
      for (auto& b : input)
        b = static_cast<uint8_t>(rng());
    } else {
      input = mutate(corpus[rng() % corpus.size()], corpus, rng);
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("standalone fuzz driver: %zu corpus inputs, %ld mutated runs, seed %llu, no crash\n",
              corpus.size(), runs, static_cast<unsigned long long>(seed));
  return 0;
}
