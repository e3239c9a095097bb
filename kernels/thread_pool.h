#pragma once
// The runtime's thread pool. parallel_for may be called from several threads at once (concurrent
// run() calls share one pool): the caller always works on its own loop too, so a loop finishes
// even when every worker is busy elsewhere.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/exec_ctx.h"

namespace nnfuse {

// Physical cores of this machine (hyper-threads not counted); at least 1.
int physical_cores();

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: physical cores; the caller counts as one
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int threads() const { return threads_; }
  // fn(arg, begin, end) over chunks covering [0, n); returns when all are done.
  void parallel_for(int64_t n, nnfuse_range_fn fn, void* arg);
  // The C ABI context handed to generated kernels.
  nnfuse_exec_ctx ctx();

 private:
  void worker();
  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::atomic<int> queued_{0};          // tasks_.size(), readable without the lock (workers spin on it)
  std::atomic<bool> stopping_{false};   // stop_, likewise
  bool stop_ = false;
};

}  // namespace nnfuse
