// commands: eldrctl's command handlers -- one admin call printed as JSON or for people, and the
// commands that also read or write local files (centroids export and import, keygen).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "tools/eldrctl/node_call.hpp"
#include "tools/eldrctl/render.hpp"

namespace eldr::ctl {

// Runs one command and prints its result: raw JSON with --json, else render(result).
template <class Render>
int run(const global_options& g, const std::string& command, json args, Render render) {
  outcome o = call_node(g, command, std::move(args));
  if (o.exit != exit_ok) return o.exit;
  if (g.json)
    std::cout << o.result.dump(2) << "\n";
  else
    render(std::cout, o.result);
  return exit_ok;
}

inline auto keyed(std::vector<std::string> preferred) {
  return [preferred = std::move(preferred)](std::ostream& out, const json& r) {
    print_object(out, r, preferred);
  };
}

int run_export(const global_options& g, const std::string& model, const CLI::Option* epoch_opt,
               uint64_t epoch, const std::string& path);

// Validates the file here first: an invalid file is refused, so is one of another model or
// geometry unless force.
int run_import(const global_options& g, const std::string& model, const std::string& path,
               bool force);

// Local: no node involved. The secret key file is created 0600 before anything is written.
int run_keygen(const std::string& prefix);

}  // namespace eldr::ctl
