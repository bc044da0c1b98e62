# Sourced by the tools/gpu/run_*.sh scripts, with R set: record the machine in
# $R/machine.txt, build stash (Release) in build-gpu - its tests too when STASH_GPU_TESTS=ON -
# logging to $R/build.log, and point the Python package and the default heaps at it.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)" >> "$R/machine.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTASH_BUILD_TESTS="${STASH_GPU_TESTS:-OFF}" \
  > "$R/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >> "$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
export STASH_LIBRARY=$PWD/build-gpu/libstash.so STASH_PROVIDER=cuda
