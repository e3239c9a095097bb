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

// After this long a spin yields the CPU on every turn: when the scheduler has put the thread we
// wait for on our CPU (it does, for seconds at a time on a shared VM), a plain spin kept it off
// the CPU until the spin ran out, at every stage, and two threads ran a model slower than one
// (MobileNetV2: 8.6 ms against 7.7). Where the other thread has a CPU of its own, sched_yield
// returns at once, but it is a system call: yielding from the first microseconds made the small
// stages of tiny models 2-4x slower at 2 threads, so short waits spin.
constexpr auto kSpinBeforeYield = std::chrono::microseconds(20);

// Spins until ready() or kSpin has passed; returns ready().
template <class Ready>
bool spin_until(const Ready& ready) {
  const auto start = std::chrono::steady_clock::now();
  bool yielding = false;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= kSpin) return ready();
      yielding = waited >= kSpinBeforeYield;
    }
    if (yielding) std::this_thread::yield();
    else cpu_relax();
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
// One parallel_for. Its chunks are split into one contiguous range per participant (the caller is
// participant 0), each range with its own counter: a participant runs its own range first, front
// to back, then takes what is left of the others' (a range's counter hands out every chunk once,
// whoever asks). Why ranges rather than one shared counter: the same participant then gets the
// same part of every loop, so a stage mostly reads what the same core wrote in the stage before
// (kernels order their tasks so that consecutive stages agree, e.g. channel blocks outermost);
// with one counter the chunks fell to the threads at random, and half of every stage's input
// came from the other core's cache (2.6x slower to read than one's own, measured on a 2-core VM).
struct Loop {
  // More threads share ranges (participant j runs range j % 8 first). A range per thread on a
  // 64-thread pool made every Loop 4 KiB, and allocating it tripled the cost of an empty loop.
  static constexpr int kMaxParts = 8;
  int64_t n = 0, chunks = 0, chunk = 0;
  int parts = 1;
  nnfuse_range_fn fn = nullptr;
  void* arg = nullptr;
  struct alignas(64) Range {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  Range range[kMaxParts];
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
  void split(int participants) {
    parts = std::min<int>(participants, kMaxParts);
    for (int j = 0; j < parts; ++j) {
      range[j].next.store(chunks * j / parts, std::memory_order_relaxed);
      range[j].end = chunks * (j + 1) / parts;
    }
  }
  // Runs chunks of range j until it is empty. The chunks it ran count as done when it stops (one
  // shared atomic add per range, not per chunk: per chunk, the cache line crossing between cores
  // cost microseconds per loop on tiny stages).
  void drain(int j) {
    int64_t ran = 0;
    for (;;) {
      const int64_t k = range[j].next.fetch_add(1, std::memory_order_relaxed);
      if (k >= range[j].end) break;
      ++ran;
      const int64_t b = k * chunk, e = std::min(n, b + chunk);
      fn(arg, b, e);
    }
    if (ran > 0 && done.fetch_add(ran) + ran == chunks) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }
  // Participant `self`: its own range, then the others'.
  void work(int self) {
    drain(self % parts);
    for (int d = 1; d < parts; ++d) drain((self + d) % parts);
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
  // Small chunks balance uneven tasks (a conv's 9 tasks of which 3 are half-size, which 4 chunks
  // per thread made 5 chunks of 2): every item is its own chunk, up to 8 per thread.
  loop->chunks = std::min<int64_t>(n, int64_t(threads_) * 8);
  loop->chunk = (n + loop->chunks - 1) / loop->chunks;
  loop->chunks = (n + loop->chunk - 1) / loop->chunk;
  loop->fn = fn;
  loop->arg = arg;
  int helpers = int(std::min<int64_t>(threads_ - 1, loop->chunks - 1));
  loop->split(helpers + 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < helpers; ++i) tasks_.push_back([loop, i] { loop->work(i + 1); });
    queued_.fetch_add(helpers, std::memory_order_relaxed);
  }
  if (helpers == 1) cv_.notify_one();
  else cv_.notify_all();
  loop->work(0);
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
