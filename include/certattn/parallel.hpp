// A small persistent thread pool with a parallel_for over heads, for the benches and the
// examples. Engines use their own pool: a certified call is single-threaded and
// reentrant, so any pool that gives each task its own workspace will do.
#pragma once

#include <certattn/common.hpp>

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace certattn {

class thread_pool {
 public:
  /// threads == 0 means std::thread::hardware_concurrency(). The calling thread works
  /// too, so a pool of t threads starts t - 1 workers.
  explicit thread_pool(std::size_t threads = 0) {
    if (threads == 0) threads = std::max<std::size_t>(1, std::thread::hardware_concurrency());
    for (std::size_t w = 1; w < threads; ++w) workers_.emplace_back([this, w] { loop(w); });
  }
  ~thread_pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  std::size_t size() const noexcept { return workers_.size() + 1; }

  /// Runs f(i, worker) for i in [0, n); worker in [0, size()) identifies the thread, so
  /// f can use per-thread workspaces. Items are handed out one at a time. The first
  /// exception thrown by f is rethrown here after all items finished.
  void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &f;
      n_ = n;
      next_ = 0;
      busy_ = workers_.size();
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    run(0);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return busy_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run(std::size_t worker) {
    for (;;) {
      std::size_t i;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (next_ >= n_) return;
        i = next_++;
      }
      try {
        (*task_)(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }
  void loop(std::size_t worker) {
    std::size_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run(worker);
      {
        std::lock_guard<std::mutex> lk(mu_);
        --busy_;
      }
      done_cv_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(std::size_t, std::size_t)>* task_ = nullptr;
  std::size_t n_ = 0, next_ = 0, busy_ = 0, generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace certattn
