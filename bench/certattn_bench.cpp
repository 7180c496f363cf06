// certattn-bench: reproduces the speed tables of certattn on synthetic KV caches.
//
//   certattn-bench speed [--context 16K,32K,64K,128K] [--threads 1,0] [--layout hnd] ...
//   certattn-bench index [--context ...] ...
//
// Every subcommand prints a table on stdout and can also write --json, --csv and --plot.
// See docs/bench.md for the flags, the columns and how bytes are counted.
#include "commands.hpp"

#include <certattn/common.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  CLI::App app{"certattn-bench: certified sparse attention vs dense attention on synthetic "
               "KV caches (see docs/bench.md)"};
  app.require_subcommand(1);
  certattn::bench::add_speed_command(app);
  certattn::bench::add_index_command(app);
  certattn::bench::add_accuracy_command(app);
  certattn::bench::add_audit_command(app);
  certattn::bench::add_monitor_command(app);
  certattn::bench::add_prefix_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const certattn::error& e) {
    std::fprintf(stderr, "certattn-bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "certattn-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
