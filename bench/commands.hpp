// The subcommands of certattn-bench. Each lives in its own file (bench/cmd_<name>.cpp) as
// one function that adds the subcommand, its flags and its callback to the application;
// certattn_bench.cpp calls them in order. A new subcommand: add the file, declare its
// function here, call it from main.
#pragma once

#include <CLI/CLI.hpp>

namespace certattn::bench {

void add_speed_command(CLI::App& app);  // cmd_speed.cpp: dense vs certified, one layer per step
void add_index_command(CLI::App& app);  // cmd_index.cpp: build, append and memory of the index
void add_accuracy_command(CLI::App& app);  // cmd_accuracy.cpp: error vs baselines at matched keys/bytes
void add_audit_command(CLI::App& app);     // cmd_audit.cpp: certificate validity at scale
void add_monitor_command(CLI::App& app);   // cmd_monitor.cpp: fidelity monitor vs true exceedance rate
void add_prefix_command(CLI::App& app);    // cmd_prefix.cpp: sequences sharing a prefix, one scan

}  // namespace certattn::bench
