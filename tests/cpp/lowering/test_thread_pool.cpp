// The runtime's thread pool (kernels/thread_pool.h): every index of a parallel_for runs exactly
// once, whatever the pool size and the number of items; concurrent callers share one pool; and a
// loop finishes when the workers are busy elsewhere (the caller takes the chunks of the ranges
// that were meant for them).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kernels/thread_pool.h"

using namespace nnfuse;

namespace {
struct Counts {
  std::vector<std::atomic<int>> hits;
  std::atomic<int> calls{0}, empty{0};
  explicit Counts(int64_t n) : hits(size_t(n)) {}
  // Runs on the pool's threads: no Catch2 assertion here (Catch2 is not thread-safe; TSan said so).
  static void body(void* p, int64_t b, int64_t e) {
    auto* c = static_cast<Counts*>(p);
    if (b >= e) c->empty.fetch_add(1);
    for (int64_t i = b; i < e; ++i) c->hits[size_t(i)].fetch_add(1);
    c->calls.fetch_add(1);
  }
  bool each_once() const {
    if (empty.load()) return false;  // a chunk of no items
    for (const auto& h : hits)
      if (h.load() != 1) return false;
    return true;
  }
};
}  // namespace

TEST_CASE("thread pool: parallel_for runs every index exactly once", "[runtime][threads]") {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 31, 32, 33, 80, 81, 1000, 4097}) {
      Counts c(n);
      pool.parallel_for(n, &Counts::body, &c);
      INFO("threads " << threads << ", n " << n);
      CHECK(c.each_once());
      // Up to 8 chunks per thread: small loops are one chunk per item, large ones are chunked.
      CHECK(c.calls.load() <= std::max<int64_t>(1, std::min<int64_t>(n, 8 * threads)));
      if (threads > 1 && n <= 8 * threads) CHECK(c.calls.load() == n);
    }
  }
}

TEST_CASE("thread pool: concurrent callers share one pool", "[runtime][threads]") {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&, t] {
      for (int r = 0; r < 200; ++r) {
        const int64_t n = 1 + (r * 7 + t * 13) % 97;
        Counts c(n);
        pool.parallel_for(n, &Counts::body, &c);
        if (!c.each_once()) bad.fetch_add(1);
      }
    });
  for (auto& c : callers) c.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("thread pool: a loop finishes while the worker is held by another loop", "[runtime][threads]") {
  ThreadPool pool(2);
  std::atomic<bool> release{false}, held{false}, a_done{false};
  // Loop A (from another thread): its chunk on the pool's one worker blocks until released.
  struct Hold {
    std::atomic<bool>* release;
    std::atomic<bool>* held;
    std::thread::id caller;
  } hold{&release, &held, {}};
  std::thread a([&] {
    hold.caller = std::this_thread::get_id();
    pool.parallel_for(
        2,
        [](void* p, int64_t, int64_t) {
          auto* h = static_cast<Hold*>(p);
          if (std::this_thread::get_id() == h->caller) return;  // the caller's own chunk
          h->held->store(true);
          while (!h->release->load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
        },
        &hold);
    a_done.store(true);
  });
  // Wait until the worker is inside loop A (or loop A's caller ran both chunks and finished).
  while (!held.load() && !a_done.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  // Loop B: half of its chunks are the worker's range; the caller must run them itself.
  Counts c(100);
  pool.parallel_for(100, &Counts::body, &c);
  CHECK(c.each_once());
  if (held.load()) CHECK_FALSE(a_done.load());  // loop B finished while loop A still held the worker
  release.store(true);
  a.join();
}
