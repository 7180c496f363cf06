// certattn: certified sparse attention on CPU. The umbrella header.
#pragma once

#include <certattn/common.hpp>
#include <certattn/memory.hpp>
#include <certattn/options.hpp>
#include <certattn/perturb.hpp>
#include <certattn/sampler.hpp>
#include <certattn/certificate.hpp>
#include <certattn/value_bounds.hpp>
#include <certattn/exact.hpp>
#include <certattn/reference.hpp>
#include <certattn/layout.hpp>
#include <certattn/index.hpp>
#include <certattn/scan.hpp>
#include <certattn/attend.hpp>
#include <certattn/parallel.hpp>
#include <certattn/monitor/monitor.hpp>
#include <certattn/dense.hpp>
