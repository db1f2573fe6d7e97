// What a step boundary of the decode pass costs, by the two ways there are to make every thread block of a step
// see what the step before wrote: one kernel per step (launched from a captured graph, as the decode step is,
// with and without programmatic dependent launch), or one persistent kernel whose thread blocks stay resident
// and meet at a grid-wide barrier between steps (cooperative groups' grid.sync(), or one arrival counter). A
// step does nothing but read one value the step before wrote and write its own, so the time per step is the
// boundary itself. Reports microseconds per step. CUDA only (the HIP build has no graphs with programmatic
// launch); skips when no GPU is present.
#include <benchmark/benchmark.h>
#include <cooperative_groups.h>

#include "backend/gpu/device.cuh"

namespace {

using namespace rf::gpu;

constexpr int kSteps = 64;
constexpr int kThreads = 256;
constexpr int kSlots = 1024;  // values a step writes: one per thread block

// Thread block b of step `step` reads a value another block wrote in the step before and writes its own.
__device__ void one_step(float* values, int step) {
  __shared__ float seen;
  if (threadIdx.x == 0) seen = values[step * kSlots + (blockIdx.x * 7) % gridDim.x];
  __syncthreads();
  if (threadIdx.x == 0) values[(step + 1) * kSlots + blockIdx.x] = seen + 1.0f;
}

__global__ void step_kernel(float* values, int step) {
  start_successor();
  wait_for_predecessor();
  one_step(values, step);
}

__global__ void grid_sync_kernel(float* values) {
  for (int step = 0; step < kSteps; ++step) {
    one_step(values, step);
    cooperative_groups::this_grid().sync();
  }
}

// One counter that only grows: a block adds 1 with release semantics, then waits with acquire loads until
// every block of the step has added its 1.
__global__ void counter_kernel(float* values, unsigned* arrivals, unsigned base) {
  for (int step = 0; step < kSteps; ++step) {
    one_step(values, step);
    if (threadIdx.x == 0) arrive_and_wait(arrivals, base + (step + 1) * gridDim.x);
    __syncthreads();
  }
}

enum class Boundary { Kernels, OverlappedKernels, GridSync, Counter };

// state.range(0): thread blocks per multiprocessor.
void boundary(benchmark::State& state, Boundary kind) {
  if (!device_available()) {
    state.SkipWithError("no GPU");
    return;
  }
  const unsigned blocks = static_cast<unsigned>(state.range(0) * device_info().multiprocessors);
  if (blocks > kSlots) {
    state.SkipWithError("more thread blocks than slots");
    return;
  }
  const Stream stream;
  const DeviceBuffer values(static_cast<size_t>(kSteps + 1) * kSlots * sizeof(float), "values");
  const DeviceBuffer arrivals(sizeof(unsigned), "arrival counter");
  check(gpuMemsetAsync(values.data(), 0, values.bytes(), stream.get()), "clearing values");
  check(gpuMemsetAsync(arrivals.data(), 0, arrivals.bytes(), stream.get()), "clearing the counter");
  float* values_device = values.as<float>();
  unsigned arrived = 0;  // what the counter holds

  Graph graph;
  if (kind == Boundary::Kernels || kind == Boundary::OverlappedKernels) {
    graph.capture(stream.get(), [&] {
      for (int step = 0; step < kSteps; ++step) {
        if (kind == Boundary::OverlappedKernels)
          launch_overlapped("step", step_kernel, blocks, kThreads, 0, stream.get(), values_device, step);
        else
          step_kernel<<<blocks, kThreads, 0, stream.get()>>>(values_device, step);
      }
    });
  }
  const auto run = [&] {
    if (kind == Boundary::Kernels || kind == Boundary::OverlappedKernels) {
      graph.launch(stream.get());
    } else if (kind == Boundary::GridSync) {
      void* args[] = {&values_device};
      check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(grid_sync_kernel), blocks, kThreads, args, 0,
                                        stream.get()),
            "grid_sync_kernel");
    } else {
      // A cooperative launch, so that every thread block is resident and the barrier cannot deadlock.
      unsigned* counter = arrivals.as<unsigned>();
      void* args[] = {&values_device, &counter, &arrived};
      check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(counter_kernel), blocks, kThreads, args, 0,
                                        stream.get()),
            "counter_kernel");
      arrived += kSteps * blocks;
    }
  };
  run();
  stream.synchronize();
  const Event start(true);
  const Event end(true);
  double seconds = 0.0;
  for (auto _ : state) {
    start.record(stream.get());
    run();
    end.record(stream.get());
    end.synchronize();
    const double elapsed = end.milliseconds_since(start) / 1e3;
    state.SetIterationTime(elapsed);
    seconds += elapsed;
  }
  state.counters["us_per_step"] = seconds / static_cast<double>(state.iterations() * kSteps) * 1e6;
}

void register_boundaries() {
  const std::pair<const char*, Boundary> kinds[] = {{"kernels", Boundary::Kernels},
                                                    {"kernels_overlapped", Boundary::OverlappedKernels},
                                                    {"grid_sync", Boundary::GridSync},
                                                    {"arrival_counter", Boundary::Counter}};
  for (const auto& [name, kind] : kinds)
    benchmark::RegisterBenchmark(name, boundary, kind)->ArgName("blocks_per_sm")->Arg(1)->Arg(2)->Arg(4)->UseManualTime();
}

const int registered = (register_boundaries(), 0);

}  // namespace

BENCHMARK_MAIN();
