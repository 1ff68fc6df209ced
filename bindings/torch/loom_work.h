/*
 * The loom backend's Work and the thread that runs it. Every process group
 * has one worker thread and one queue: a call checks its arguments in the
 * caller's thread, queues a job and returns its Work at once; the worker
 * makes the job's Loom calls in queue order, so the order in which ranks
 * issue collectives is the order in which their communicator sees them
 * (NCCL's rule), while the caller goes on (DDP's backward overlaps its
 * gradient AllReduce this way, as with gloo). One thread per group, not a
 * pool: a communicator takes one call at a time, and two threads on one
 * communicator could issue its calls in different orders on different
 * ranks. Included by loom_torch.cpp only.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_WORK_H
#define LOOM_WORK_H

#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loom_torch {

// A Work done by the group's worker thread. complete() runs the copy-out
// step, if any, completes the future (DDP's reducer chains on it), then
// the Work (waking wait()).
class LoomWork : public c10d::Work {
public:
  LoomWork(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
           const std::vector<at::Tensor> &inputs)
      : c10d::Work(rank, type, title, std::optional<std::vector<at::Tensor>>(inputs)), outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  void complete(std::exception_ptr e) {
    if (!e && post) {
      try {
        post();
      } catch (...) {
        e = std::current_exception();
      }
    }
    post = nullptr;
    keep.clear();
    if (e)
      future_->setError(e);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(e);
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  std::function<void()> post;   // copies results out of temporaries
  std::vector<at::Tensor> keep; // temporaries that must outlive the calls

private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One entry of the queue: the calls to make and the Works they complete
// (several for a coalesced group). run returns the exception for a
// failure, or nullptr.
struct LoomJob {
  std::vector<c10::intrusive_ptr<LoomWork>> works;
  std::function<std::exception_ptr()> run;
};

class LoomWorker {
public:
  LoomWorker() : thread_([this] { loop(); }) {}

  // Runs what is queued, then stops.
  ~LoomWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void push(LoomJob job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

private:
  void loop() {
    for (;;) {
      LoomJob job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty())
          return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr e;
      try {
        e = job.run();
      } catch (...) {
        e = std::current_exception();
      }
      for (auto &w : job.works)
        w->complete(e);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<LoomJob> queue_;
  bool stop_ = false;
  std::thread thread_;
};

} // namespace loom_torch

#endif
