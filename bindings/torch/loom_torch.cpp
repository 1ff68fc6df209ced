/*
 * Loom as a torch.distributed backend on CPU tensors (PyTorch 1.13's c10d
 * API): ProcessGroupLoom runs every collective through one Loom host
 * communicator. loom_torch/__init__.py loads this module and registers it
 * as the backend "loom", so dist.init_process_group("loom", ...) works.
 *
 * Decisions, written down here where the code makes them:
 * - Rendezvous: rank 0 calls ncclGetUniqueId and puts the 128 bytes in
 *   torch's Store under "loom_unique_id"; the others get them (the store's
 *   own timeout bounds the wait). Each process group (new_group) has its
 *   own prefixed store and its own communicator.
 * - Loom's host calls return when their result is in place, so work runs
 *   in the calling thread and its Work is complete when the call returns:
 *   isCompleted() is true at once, wait() rethrows a failure, getFuture()
 *   is a completed (or failed) future holding the output tensors (DDP's
 *   reducer reads it). Between _start_coalescing and _end_coalescing
 *   (batch_isend_irecv) calls are queued in one ncclGroupStart/End and
 *   their Work completes at _end_coalescing.
 * - Argument errors (non-CPU, sparse or non-contiguous tensors, dtypes
 *   Loom has not, shapes that do not fit) raise at the call, before any
 *   data moves. A failure Loom returns fails the Work with a RuntimeError
 *   naming the call, the ncclResult_t and ncclGetLastError's sentence;
 *   wait() (which the synchronous torch.distributed functions call)
 *   raises it. After a failure that is not a local argument error the
 *   communicator is aborted and every later call on the group raises.
 * - One tensor per call (like the MPI backend): a list of several tensors
 *   would mean "replicas on several devices" in torch's old API, which has
 *   no meaning on CPU. allreduce_coalesced takes several distinct tensors.
 * - bool travels as uint8; SUM and MAX on bool are a logical or, PRODUCT
 *   and MIN a logical and (as torch's NCCL backend does). int16 and the
 *   complex types have no NCCL type and are refused.
 * - send/recv ignore the tag (NCCL has none); messages between two ranks
 *   arrive in the order they were sent. A plain isend returns after the
 *   data left, so two ranks that both isend a large tensor before their
 *   irecv wait for each other; batch_isend_irecv runs them together.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <torch/extension.h>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "loom.h"
#include "loom_torch_args.h"
#include "nccl.h"

namespace loom_torch {

namespace {
constexpr const char *kBackendName = "loom";
constexpr const char *kUniqueIdKey = "loom_unique_id";

} // namespace

// A Work whose operation ran in the calling thread (or, coalesced, at
// _end_coalescing). complete() runs the copy-out step, if any, then
// completes the future and the Work.
class LoomWork : public c10d::Work {
public:
  LoomWork(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
           const c10::optional<std::vector<at::Tensor>> &inputs)
      : c10d::Work(rank, type, title, inputs), outputs_(std::move(outputs)),
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
    pending = false;
    if (e)
      future_->setError(e);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(e);
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (pending) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!completed_)
        TORCH_CHECK(false, "loom backend: this work is part of a coalesced group (batch_isend_irecv) that has not "
                           "ended yet; it completes at _end_coalescing");
    }
    return c10d::Work::wait(timeout);
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  std::function<void()> post;     // copies results out of temporaries
  std::vector<at::Tensor> keep;   // temporaries that must outlive the call
  std::atomic<bool> pending{false};

private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupLoom : public c10d::ProcessGroup {
public:
  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size) : ProcessGroup(rank, size) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        throw std::runtime_error(c10::str("loom backend: ncclGetUniqueId failed: ", ncclGetErrorString(r), ": ",
                                          ncclGetLastError(nullptr)));
      std::vector<uint8_t> bytes(reinterpret_cast<uint8_t *>(&id), reinterpret_cast<uint8_t *>(&id) + sizeof id);
      store->set(kUniqueIdKey, bytes);
    } else {
      std::vector<uint8_t> bytes = store->get(kUniqueIdKey);
      if (bytes.size() != sizeof id)
        throw std::runtime_error(c10::str("loom backend: the store's ", kUniqueIdKey, " holds ", bytes.size(),
                                          " bytes, not the ", sizeof id, " of an ncclUniqueId"));
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    // The loom backend is a CPU backend: its communicator is a host one
    // even where this Loom was built with CUDA and sees a GPU. LOOM_DEVICE
    // is read when the communicator is made, so it is set only for that.
    const char *dev = std::getenv("LOOM_DEVICE");
    bool set_dev = dev == nullptr || dev[0] == '\0';
    if (set_dev)
      setenv("LOOM_DEVICE", "host", 1);
    ncclResult_t r = ncclCommInitRank(&comm_, size, id, rank);
    if (set_dev)
      unsetenv("LOOM_DEVICE");
    if (r != ncclSuccess)
      throw std::runtime_error(c10::str("loom backend: ncclCommInitRank (rank ", rank, " of ", size,
                                        ") failed: ", ncclGetErrorString(r), ": ", ncclGetLastError(comm_)));
    int is_host = 0;
    if (loomCommIsHost(comm_, &is_host) != ncclSuccess || !is_host) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw std::runtime_error("loom backend: Loom made a CUDA communicator, but the loom backend needs a host one");
    }
    init();
  }

  ~ProcessGroupLoom() override {
    if (comm_ == nullptr)
      return;
    if (broken_)
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

  const std::string getBackendName() const override { return kBackendName; }

  void startCoalescing() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_live();
    TORCH_CHECK(!coalescing_, "loom backend: _start_coalescing called twice without _end_coalescing");
    call(ncclGroupStart(), "ncclGroupStart");
    coalescing_ = true;
  }

  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>> & /* reqs */) override {
    std::vector<c10::intrusive_ptr<LoomWork>> works;
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      TORCH_CHECK(coalescing_, "loom backend: _end_coalescing without _start_coalescing");
      coalescing_ = false;
      works.swap(pending_);
      ncclResult_t r = ncclGroupEnd();
      if (r != ncclSuccess)
        e = failure(r, "ncclGroupEnd (ending a coalesced group)");
      if (!e && pending_error_)
        e = pending_error_;
      pending_error_ = nullptr;
    }
    for (auto &w : works)
      w->complete(e);
    if (e)
      std::rethrow_exception(e);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override {
    check_single(tensors, "broadcast's tensor");
    check_root(opts.rootRank, "broadcast");
    TORCH_CHECK(opts.rootTensor == 0, "loom backend: broadcast's rootTensor must be 0, not ", opts.rootTensor);
    at::Tensor &t = tensors[0];
    return run(c10d::OpType::BROADCAST, "loom:broadcast", tensors, tensors, [&] {
      return std::make_pair(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t, ""),
                                          (int)opts.rootRank, comm_, nullptr),
                            "ncclBroadcast");
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override {
    check_single(tensors, "allreduce's tensor");
    at::Tensor &t = tensors[0];
    ncclRedOp_t op = nccl_op(opts.reduceOp, t);
    return run(c10d::OpType::ALLREDUCE, "loom:all_reduce", tensors, tensors, [&] {
      return std::make_pair(
          ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t, ""), op, comm_, nullptr),
          "ncclAllReduce");
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                     const c10d::AllreduceCoalescedOptions &opts) override {
    TORCH_CHECK(!tensors.empty(), "loom backend: allreduce_coalesced needs at least one tensor");
    std::vector<ncclRedOp_t> ops;
    for (auto &t : tensors) {
      check_tensor(t, "an allreduce_coalesced tensor");
      ops.push_back(nccl_op(opts.reduceOp, t));
    }
    return run(c10d::OpType::ALLREDUCE_COALESCED, "loom:all_reduce_coalesced", tensors, tensors, [&] {
      return grouped("ncclAllReduce (allreduce_coalesced)", [&]() -> ncclResult_t {
        for (size_t i = 0; i < tensors.size(); i++) {
          at::Tensor &t = tensors[i];
          ncclResult_t r =
              ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t, ""), ops[i], comm_, nullptr);
          if (r != ncclSuccess)
            return r;
        }
        return ncclSuccess;
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts) override {
    check_single(tensors, "reduce's tensor");
    check_root(opts.rootRank, "reduce");
    TORCH_CHECK(opts.rootTensor == 0, "loom backend: reduce's rootTensor must be 0, not ", opts.rootTensor);
    at::Tensor &t = tensors[0];
    ncclRedOp_t op = nccl_op(opts.reduceOp, t);
    return run(c10d::OpType::REDUCE, "loom:reduce", tensors, tensors, [&] {
      return std::make_pair(ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t, ""), op,
                                       (int)opts.rootRank, comm_, nullptr),
                            "ncclReduce");
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions & /* opts */) override {
    check_single(inputs, "allgather's input");
    TORCH_CHECK(outputs.size() == 1, "loom backend: allgather takes one list of output tensors, not ",
                outputs.size());
    at::Tensor &in = inputs[0];
    auto &outs = outputs[0];
    TORCH_CHECK((int)outs.size() == size_, "loom backend: allgather's output list has ", outs.size(),
                " tensors but the group has ", size_, " ranks");
    for (auto &o : outs) {
      check_tensor(o, "an allgather output");
      check_like(o, in, "an allgather output", "the input");
    }
    at::Tensor flat = at::empty({(int64_t)size_ * in.numel()}, in.options());
    auto work = make_work(c10d::OpType::ALLGATHER, "loom:all_gather", outs, inputs);
    work->keep = {flat};
    work->post = [flat, outs, n = in.numel()]() mutable {
      for (size_t r = 0; r < outs.size(); r++)
        outs[r].view({-1}).copy_(flat.narrow(0, (int64_t)r * n, n));
    };
    return launch(work, [&] {
      return std::make_pair(
          ncclAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), nccl_type(in, ""), comm_, nullptr),
          "ncclAllGather");
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions & /* opts */) override {
    check_tensor(input, "all_gather_into_tensor's input");
    check_tensor(output, "all_gather_into_tensor's output");
    check_same_type(output, input, "all_gather_into_tensor's output", "its input");
    TORCH_CHECK(output.numel() == (int64_t)size_ * input.numel(), "loom backend: all_gather_into_tensor's output has ",
                output.numel(), " elements but must have ", size_, " (ranks) x ", input.numel(),
                " (the input's) = ", (int64_t)size_ * input.numel());
    std::vector<at::Tensor> ins{input}, outs{output};
    return run(c10d::OpType::_ALLGATHER_BASE, "loom:all_gather_into_tensor", outs, ins, [&] {
      return std::make_pair(
          ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), nccl_type(input, ""), comm_, nullptr),
          "ncclAllGather");
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                                                     std::vector<at::Tensor> &inputs,
                                                     const c10d::AllgatherOptions &opts) override {
    // c10d's contract: one output list per rank, outputs[r][i] receiving
    // rank r's input i (not one list per input).
    TORCH_CHECK((int)outputs.size() == size_, "loom backend: all_gather_coalesced has ", outputs.size(),
                " output lists but the group has ", size_, " ranks: it takes one list per rank");
    for (size_t r = 0; r < outputs.size(); r++)
      TORCH_CHECK(outputs[r].size() == inputs.size(), "loom backend: all_gather_coalesced's output list for rank ",
                  r, " has ", outputs[r].size(), " tensors but there are ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); i++) {
      std::vector<std::vector<at::Tensor>> o(1);
      for (size_t r = 0; r < outputs.size(); r++)
        o[0].push_back(outputs[r][i]);
      std::vector<at::Tensor> in{inputs[i]};
      auto w = allgather(o, in, opts);
      w->wait();
    }
    std::vector<at::Tensor> flat;
    for (auto &l : outputs)
      flat.insert(flat.end(), l.begin(), l.end());
    auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, "loom:all_gather_coalesced", flat, inputs);
    work->complete(nullptr);
    return work;
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override {
    check_single(outputs, "reduce_scatter's output");
    TORCH_CHECK(inputs.size() == 1, "loom backend: reduce_scatter takes one list of input tensors, not ",
                inputs.size());
    at::Tensor &out = outputs[0];
    auto &ins = inputs[0];
    TORCH_CHECK((int)ins.size() == size_, "loom backend: reduce_scatter's input list has ", ins.size(),
                " tensors but the group has ", size_, " ranks");
    for (auto &i : ins) {
      check_tensor(i, "a reduce_scatter input");
      check_like(i, out, "a reduce_scatter input", "the output");
    }
    ncclRedOp_t op = nccl_op(opts.reduceOp, out);
    std::vector<at::Tensor> flats;
    for (auto &i : ins)
      flats.push_back(i.view({-1}));
    at::Tensor flat = at::cat(flats);
    auto work = make_work(c10d::OpType::REDUCE_SCATTER, "loom:reduce_scatter", outputs, ins);
    work->keep = {flat};
    return launch(work, [&] {
      return std::make_pair(ncclReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), nccl_type(out, ""), op,
                                              comm_, nullptr),
                            "ncclReduceScatter");
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                      const c10d::ReduceScatterOptions &opts) override {
    check_tensor(input, "reduce_scatter_tensor's input");
    check_tensor(output, "reduce_scatter_tensor's output");
    check_same_type(output, input, "reduce_scatter_tensor's output", "its input");
    TORCH_CHECK(input.numel() == (int64_t)size_ * output.numel(), "loom backend: reduce_scatter_tensor's input has ",
                input.numel(), " elements but must have ", size_, " (ranks) x ", output.numel(),
                " (the output's) = ", (int64_t)size_ * output.numel());
    ncclRedOp_t op = nccl_op(opts.reduceOp, output);
    std::vector<at::Tensor> ins{input}, outs{output};
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, "loom:reduce_scatter_tensor", outs, ins, [&] {
      return std::make_pair(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                              nccl_type(output, ""), op, comm_, nullptr),
                            "ncclReduceScatter");
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &outputSplitSizes,
                                               std::vector<int64_t> &inputSplitSizes,
                                               const c10d::AllToAllOptions & /* opts */) override {
    check_tensor(input, "all_to_all_single's input");
    check_tensor(output, "all_to_all_single's output");
    check_same_type(output, input, "all_to_all_single's output", "its input");
    std::vector<int64_t> scount, soff, rcount, roff;
    splits(input, inputSplitSizes, "input", scount, soff);
    splits(output, outputSplitSizes, "output", rcount, roff);
    std::vector<at::Tensor> ins{input}, outs{output};
    return run(c10d::OpType::ALLTOALL_BASE, "loom:all_to_all_single", outs, ins, [&] {
      return exchange(input, scount, soff, output, rcount, roff, "ncclSend/ncclRecv (all_to_all_single)");
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions & /* opts */) override {
    TORCH_CHECK((int)inputs.size() == size_ && (int)outputs.size() == size_, "loom backend: all_to_all takes ",
                size_, " input and ", size_, " output tensors (one per rank), not ", inputs.size(), " and ",
                outputs.size());
    for (int r = 0; r < size_; r++) {
      check_tensor(inputs[r], "an all_to_all input");
      check_tensor(outputs[r], "an all_to_all output");
      check_same_type(inputs[r], inputs[0], "an all_to_all input", "the first input");
      check_same_type(outputs[r], inputs[0], "an all_to_all output", "the first input");
    }
    return run(c10d::OpType::ALLTOALL, "loom:all_to_all", outputs, inputs, [&] {
      return grouped("ncclSend/ncclRecv (all_to_all)", [&]() -> ncclResult_t {
        for (int p = 0; p < size_; p++) {
          if (p == rank_) {
            if (outputs[p].numel() == inputs[p].numel())
              outputs[p].view({-1}).copy_(inputs[p].view({-1}));
            else
              TORCH_CHECK(false, "loom backend: all_to_all's own input has ", inputs[p].numel(),
                          " elements but its own output ", outputs[p].numel());
            continue;
          }
          ncclResult_t r = ncclSuccess;
          if (inputs[p].numel() > 0)
            r = ncclSend(inputs[p].data_ptr(), inputs[p].numel(), nccl_type(inputs[p], ""), p, comm_, nullptr);
          if (r == ncclSuccess && outputs[p].numel() > 0)
            r = ncclRecv(outputs[p].data_ptr(), outputs[p].numel(), nccl_type(outputs[p], ""), p, comm_, nullptr);
          if (r != ncclSuccess)
            return r;
        }
        return ncclSuccess;
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) override {
    check_single(inputs, "gather's input");
    check_root(opts.rootRank, "gather");
    at::Tensor &in = inputs[0];
    int root = (int)opts.rootRank;
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
      TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == size_, "loom backend: gather's root needs one list of ",
                  size_, " output tensors");
      outs = outputs[0];
      for (auto &o : outs) {
        check_tensor(o, "a gather output");
        check_like(o, in, "a gather output", "the input");
      }
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "loom backend: gather's output list is only for the root rank ", root);
    }
    return run(c10d::OpType::GATHER, "loom:gather", outs, inputs, [&] {
      return grouped("ncclSend/ncclRecv (gather)", [&]() -> ncclResult_t {
        ncclDataType_t dt = nccl_type(in, "");
        if (rank_ != root)
          return ncclSend(in.data_ptr(), in.numel(), dt, root, comm_, nullptr);
        for (int p = 0; p < size_; p++) {
          if (p == rank_) {
            outs[p].copy_(in);
            continue;
          }
          ncclResult_t r = ncclRecv(outs[p].data_ptr(), outs[p].numel(), dt, p, comm_, nullptr);
          if (r != ncclSuccess)
            return r;
        }
        return ncclSuccess;
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override {
    check_single(outputs, "scatter's output");
    check_root(opts.rootRank, "scatter");
    at::Tensor &out = outputs[0];
    int root = (int)opts.rootRank;
    std::vector<at::Tensor> ins;
    if (rank_ == root) {
      TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == size_, "loom backend: scatter's root needs one list of ",
                  size_, " input tensors");
      ins = inputs[0];
      for (auto &i : ins) {
        check_tensor(i, "a scatter input");
        check_like(i, out, "a scatter input", "the output");
      }
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "loom backend: scatter's input list is only for the root rank ", root);
    }
    return run(c10d::OpType::SCATTER, "loom:scatter", outputs, ins, [&] {
      return grouped("ncclSend/ncclRecv (scatter)", [&]() -> ncclResult_t {
        ncclDataType_t dt = nccl_type(out, "");
        if (rank_ != root)
          return ncclRecv(out.data_ptr(), out.numel(), dt, root, comm_, nullptr);
        for (int p = 0; p < size_; p++) {
          if (p == rank_) {
            out.copy_(ins[p]);
            continue;
          }
          ncclResult_t r = ncclSend(ins[p].data_ptr(), ins[p].numel(), dt, p, comm_, nullptr);
          if (r != ncclSuccess)
            return r;
        }
        return ncclSuccess;
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dstRank, int /* tag */) override {
    check_single(tensors, "send's tensor");
    check_peer(dstRank, "send");
    at::Tensor &t = tensors[0];
    return run(c10d::OpType::SEND, "loom:send", {}, tensors, [&] {
      return std::make_pair(ncclSend(t.data_ptr(), t.numel(), nccl_type(t, ""), dstRank, comm_, nullptr), "ncclSend");
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int srcRank, int /* tag */) override {
    check_single(tensors, "recv's tensor");
    check_peer(srcRank, "recv");
    at::Tensor &t = tensors[0];
    return run(c10d::OpType::RECV, "loom:recv", tensors, {}, [&] {
      return std::make_pair(ncclRecv(t.data_ptr(), t.numel(), nccl_type(t, ""), srcRank, comm_, nullptr), "ncclRecv");
    });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> & /* tensors */, int /* tag */) override {
    TORCH_CHECK(false, "loom backend: recv without a source rank is not supported (NCCL has no receive from any "
                       "rank): name the source");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions & /* opts */) override {
    std::vector<at::Tensor> none;
    return run(c10d::OpType::BARRIER, "loom:barrier", none, none, [&] {
      return std::make_pair(ncclAllReduce(&barrier_byte_, &barrier_byte_, 1, ncclUint8, ncclSum, comm_, nullptr),
                            "ncclAllReduce (barrier)");
    });
  }

  // For tests and diagnostics: the transport to a peer, as Loom names it.
  std::string peerTransport(int peer) {
    const char *name = nullptr;
    if (comm_ == nullptr || loomCommPeerTransport(comm_, peer, &name) != ncclSuccess || name == nullptr)
      return "unknown";
    return name;
  }

  static c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                                       int size, const std::chrono::duration<float> & /* timeout */) {
    return c10::make_intrusive<ProcessGroupLoom>(store, rank, size);
  }

private:
  using Launch = std::pair<ncclResult_t, const char *>;

  void check_live() {
    TORCH_CHECK(comm_ != nullptr && !broken_, "loom backend: this process group's communicator was aborted after an "
                                              "earlier failure: ",
                broken_msg_, " [destroy the group and make a new one]");
  }

  void check_root(int64_t root, const char *what) {
    TORCH_CHECK(root >= 0 && root < size_, "loom backend: ", what, "'s root rank ", root,
                " is not a rank of this group of ", size_);
  }

  void check_peer(int peer, const char *what) {
    TORCH_CHECK(peer >= 0 && peer < size_, "loom backend: ", what, "'s peer rank ", peer,
                " is not a rank of this group of ", size_);
    TORCH_CHECK(peer != rank_, "loom backend: ", what, " to or from its own rank ", peer, " is not supported");
  }

  // The counts and offsets (in elements) of each rank's part of a tensor
  // split along dim 0, equally when sizes is empty.
  void splits(const at::Tensor &t, const std::vector<int64_t> &sizes, const char *what, std::vector<int64_t> &count,
              std::vector<int64_t> &off) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    int64_t row = rows == 0 ? 0 : t.numel() / rows;
    std::vector<int64_t> s = sizes;
    if (s.empty()) {
      TORCH_CHECK(rows % size_ == 0, "loom backend: all_to_all_single's ", what, " has ", rows,
                  " rows, which do not split equally over ", size_, " ranks: pass split sizes");
      s.assign(size_, rows / size_);
    }
    TORCH_CHECK((int)s.size() == size_, "loom backend: all_to_all_single's ", what, " split sizes name ", s.size(),
                " ranks but the group has ", size_);
    int64_t sum = 0;
    for (int64_t v : s) {
      TORCH_CHECK(v >= 0, "loom backend: all_to_all_single's ", what, " split sizes must not be negative");
      sum += v;
    }
    TORCH_CHECK(sum == rows, "loom backend: all_to_all_single's ", what, " split sizes add up to ", sum,
                " rows but the tensor has ", rows);
    int64_t o = 0;
    for (int64_t v : s) {
      count.push_back(v * row);
      off.push_back(o);
      o += v * row;
    }
  }

  Launch exchange(const at::Tensor &in, const std::vector<int64_t> &scount, const std::vector<int64_t> &soff,
                  at::Tensor &out, const std::vector<int64_t> &rcount, const std::vector<int64_t> &roff,
                  const char *what) {
    ncclDataType_t dt = nccl_type(in, "");
    size_t esz = in.element_size();
    char *sp = static_cast<char *>(in.data_ptr());
    char *rp = static_cast<char *>(out.data_ptr());
    TORCH_CHECK(scount[rank_] == rcount[rank_], "loom backend: all_to_all_single sends ", scount[rank_],
                " elements to its own rank but receives ", rcount[rank_]);
    return grouped(what, [&]() -> ncclResult_t {
      for (int p = 0; p < size_; p++) {
        if (p == rank_) {
          if (scount[p] > 0)
            std::memcpy(rp + roff[p] * esz, sp + soff[p] * esz, scount[p] * esz);
          continue;
        }
        ncclResult_t r = ncclSuccess;
        if (scount[p] > 0)
          r = ncclSend(sp + soff[p] * esz, scount[p], dt, p, comm_, nullptr);
        if (r == ncclSuccess && rcount[p] > 0)
          r = ncclRecv(rp + roff[p] * esz, rcount[p], dt, p, comm_, nullptr);
        if (r != ncclSuccess)
          return r;
      }
      return ncclSuccess;
    });
  }

  // Runs calls inside ncclGroupStart/End; the first failure is the result.
  template <typename F> Launch grouped(const char *what, F &&calls) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
      return {r, "ncclGroupStart"};
    ncclResult_t rc;
    try {
      rc = calls();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    ncclResult_t re = ncclGroupEnd();
    if (rc != ncclSuccess)
      return {rc, what};
    return {re, "ncclGroupEnd"};
  }

  c10::intrusive_ptr<LoomWork> make_work(c10d::OpType type, const char *title, const std::vector<at::Tensor> &outs,
                                         const std::vector<at::Tensor> &ins) {
    return c10::make_intrusive<LoomWork>(rank_, type, title, outs, c10::optional<std::vector<at::Tensor>>(ins));
  }

  template <typename F>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, const char *title, const std::vector<at::Tensor> &outs,
                                     const std::vector<at::Tensor> &ins, F &&calls) {
    return launch(make_work(type, title, outs, ins), std::forward<F>(calls));
  }

  // Makes the calls; outside a coalesced group the work completes now,
  // inside one at _end_coalescing.
  template <typename F> c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<LoomWork> work, F &&calls) {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_live();
      Launch l = calls();
      if (l.first != ncclSuccess)
        e = failure(l.first, l.second);
      if (coalescing_) {
        if (e && !pending_error_)
          pending_error_ = e;
        work->pending = true;
        pending_.push_back(work);
        return work;
      }
    }
    work->complete(e);
    return work;
  }

  // The exception for a failed call, with Loom's sentence. A failure other
  // than a local argument error may leave the ranks out of step, so the
  // communicator is marked broken (aborted when the group is destroyed).
  std::exception_ptr failure(ncclResult_t r, const char *call) {
    const char *last = ncclGetLastError(comm_);
    std::string msg = c10::str("loom backend: ", call, " failed on rank ", rank_, " of ", size_, ": ",
                               ncclGetErrorString(r), ": ", last && last[0] ? last : "(no detail)");
    if (r != ncclInvalidArgument) {
      broken_ = true;
      broken_msg_ = msg;
    }
    return std::make_exception_ptr(c10::Error(msg, ""));
  }

  void call(ncclResult_t r, const char *what) {
    if (r != ncclSuccess)
      std::rethrow_exception(failure(r, what));
  }

  ncclComm_t comm_ = nullptr;
  std::mutex mu_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<LoomWork>> pending_;
  std::exception_ptr pending_error_;
  bool broken_ = false;
  std::string broken_msg_;
  uint8_t barrier_byte_ = 0;
};

} // namespace loom_torch

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  m.doc() = "Loom's torch.distributed backend (ProcessGroupLoom); import loom_torch to register it";
  py::class_<loom_torch::ProcessGroupLoom, c10d::ProcessGroup, c10::intrusive_ptr<loom_torch::ProcessGroupLoom>>(
      m, "ProcessGroupLoom")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size) {
             return c10::make_intrusive<loom_torch::ProcessGroupLoom>(store, rank, size);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::call_guard<py::gil_scoped_release>())
      .def("peer_transport", &loom_torch::ProcessGroupLoom::peerTransport, py::arg("peer"));
  m.def("create_process_group", &loom_torch::ProcessGroupLoom::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "The backend's creator: (store, rank, size, timeout) -> ProcessGroupLoom");
  m.def("nccl_version", []() {
    int v = 0;
    ncclGetVersion(&v);
    return v;
  });
  m.def("transports", []() { return std::string(loomTransports()); });
}
