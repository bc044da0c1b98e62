# Sourced by the tools/gpu/run_*.sh scripts: build stash (Release, no tests) in build-gpu,
# logging to $R/build.log, and point the Python package and the default heaps at it.
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTASH_BUILD_TESTS=OFF > "$R/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >> "$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
export STASH_LIBRARY=$PWD/build-gpu/libstash.so STASH_PROVIDER=cuda
