// certattn's runtime fidelity monitor: anytime-valid confidence sequences over sampled
// dense probes, the probe scheduler and the monitor that ties them to an engine
// (docs/monitor.md).
#pragma once

#include <certattn/monitor/confidence_sequence.hpp>
#include <certattn/monitor/fidelity_monitor.hpp>
#include <certattn/monitor/probe_scheduler.hpp>
