// certattn: certified sparse attention on CPU. The umbrella header: what an engine calls
// (the key index, the certified call and its certificate, the dense kernel, layouts).
// Opt-in headers, not included here:
//   <certattn/exact.hpp>      exact attention in double, the oracle of the tests
//   <certattn/reference.hpp>  the reference estimator the fast path is compared with
//   <certattn/parallel.hpp>   a small thread pool (engines use their own)
//   <certattn/monitor/monitor.hpp>  the runtime fidelity monitor
#pragma once

#include <certattn/common.hpp>
#include <certattn/float16.hpp>
#include <certattn/memory.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/sampler.hpp>
#include <certattn/certificate.hpp>
#include <certattn/rounding.hpp>
#include <certattn/value_bounds.hpp>
#include <certattn/layout.hpp>
#include <certattn/index.hpp>
#include <certattn/scan.hpp>
#include <certattn/history.hpp>
#include <certattn/attend.hpp>
#include <certattn/dense.hpp>
