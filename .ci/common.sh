# Sourced by .ci/test and .ci/main-job: the Debian bookworm packages the build needs, and
# an installer that touches the network only when one of them is missing.

# Everything the default configure (tests, bench, examples) needs.
CERTATTN_BUILD_PACKAGES=(cmake g++ make libeigen3-dev libxsimd-dev libcli11-dev libgtest-dev
                         libbenchmark-dev)

# What `.ci/test python` needs: the Python extension (pybind11, Debian's python3) and its
# tests (NumPy, pytest, and PyTorch for the torch inputs and the llama2.c example).
CERTATTN_PYTHON_PACKAGES=(cmake g++ make libeigen3-dev libxsimd-dev python3-dev pybind11-dev
                          python3-pybind11 python3-numpy python3-pytest python3-torch)

# What tests/fuzz/run.sh needs: clang with libFuzzer (libclang-rt-14-dev holds it on
# bookworm) and the headers the library includes.
CERTATTN_FUZZ_PACKAGES=(clang libclang-rt-14-dev libeigen3-dev)

# ensure_packages PKG...: apt-get install the packages that dpkg does not list as installed.
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' ok installed$'; then
      missing+=("$p")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing packages: ${missing[*]}; run as root or install them first" >&2
    return 1
  fi
  echo "installing missing packages: ${missing[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# The aarch64 cross build (bash .ci/test aarch64): the cross compiler with its C library,
# qemu-user to run the result, and GoogleTest's sources to build the test library for the
# target (Debian's libgtest-dev holds only the build machine's).
CERTATTN_AARCH64_PACKAGES=(g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user googletest)
