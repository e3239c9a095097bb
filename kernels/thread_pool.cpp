#include "kernels/thread_pool.h"

#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>

namespace nnfuse {

namespace {
// How long a worker looks for work, and a caller for its loop's end, before sleeping on a
// condition variable. A model's kernels follow each other within microseconds, while waking a
// sleeping thread costs tens of them: without the spin, small kernels (MobileNet's ~100 us
// stages) barely gained from a second thread.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until ready() or kSpin has passed; returns ready().
template <class Ready>
bool spin_until(const Ready& ready) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= end) return ready();
    cpu_relax();
  }
}
}  // namespace

int physical_cores() {
  static const int n = [] {
    std::ifstream f("/proc/cpuinfo");
    std::set<std::pair<std::string, std::string>> cores;
    std::string line, phys = "0";
    while (std::getline(f, line)) {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
      std::string val = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
      if (key == "physical id") phys = val;
      if (key == "core id") cores.insert({phys, val});
    }
    int c = int(cores.size());
    if (c <= 0) c = int(std::max(1u, std::thread::hardware_concurrency()));
    return c;
  }();
  return n;
}

ThreadPool::ThreadPool(int threads) : threads_(threads > 0 ? threads : physical_cores()) {
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker() {
  for (;;) {
    std::function<void()> task;
    spin_until([&] { return queued_.load(std::memory_order_relaxed) > 0 || stopping_.load(std::memory_order_relaxed); });
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (stop_ && tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    task();
  }
}

namespace {
struct Loop {
  int64_t n = 0, chunks = 0, chunk = 0;
  nnfuse_range_fn fn = nullptr;
  void* arg = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
  // Runs chunks until none is left; returns after the last one it ran.
  void work() {
    for (;;) {
      int64_t k = next.fetch_add(1);
      if (k >= chunks) return;
      int64_t b = k * chunk, e = std::min(n, b + chunk);
      fn(arg, b, e);
      if (done.fetch_add(1) + 1 == chunks) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};
}  // namespace

void ThreadPool::parallel_for(int64_t n, nnfuse_range_fn fn, void* arg) {
  if (n <= 0) return;
  if (threads_ <= 1 || n == 1) {
    fn(arg, 0, n);
    return;
  }
  auto loop = std::make_shared<Loop>();
  loop->n = n;
  // A few chunks per thread balances uneven tasks; never more chunks than items.
  loop->chunks = std::min<int64_t>(n, int64_t(threads_) * 4);
  loop->chunk = (n + loop->chunks - 1) / loop->chunks;
  loop->chunks = (n + loop->chunk - 1) / loop->chunk;
  loop->fn = fn;
  loop->arg = arg;
  int helpers = int(std::min<int64_t>(threads_ - 1, loop->chunks - 1));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < helpers; ++i) tasks_.push_back([loop] { loop->work(); });
    queued_.fetch_add(helpers, std::memory_order_relaxed);
  }
  if (helpers == 1) cv_.notify_one();
  else cv_.notify_all();
  loop->work();
  if (!spin_until([&] { return loop->done.load() >= loop->chunks; })) {
    std::unique_lock<std::mutex> lock(loop->mu);
    loop->cv.wait(lock, [&] { return loop->done.load() >= loop->chunks; });
  }
}

nnfuse_exec_ctx ThreadPool::ctx() {
  nnfuse_exec_ctx c;
  c.pool = this;
  c.parallel_for = [](void* pool, int64_t n, nnfuse_range_fn fn, void* arg) { static_cast<ThreadPool*>(pool)->parallel_for(n, fn, arg); };
  c.threads = threads_;
  c.status = nullptr;
  return c;
}

}  // namespace nnfuse
