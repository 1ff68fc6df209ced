/*
 * Loom as a torch.distributed backend on CPU tensors (torch 2.x's
 * c10d::Backend): ProcessGroupLoom runs every collective through one Loom
 * host communicator. loom_torch/__init__.py loads this module and
 * registers it as the backend "loom" for the CPU device, so
 * dist.init_process_group("loom", ...) works.
 *
 * Decisions, written down here where the code makes them:
 * - Rendezvous: rank 0 calls ncclGetUniqueId and puts the 128 bytes in
 *   torch's Store under "loom_unique_id"; the others get them (the store's
 *   own timeout bounds the wait). new_group gets its own prefixed store and
 *   its own communicator; split_group splits the parent's (ncclCommSplit).
 * - Asynchronous like gloo (loom_work.h): a call checks its arguments here,
 *   in the caller's thread, and raises at once on a bad one; then it queues
 *   the Loom calls for the group's worker thread and returns a Work.
 *   wait() raises the failure, if any; getFuture() holds the outputs.
 * - Timeouts: the group's timeout (or an op's own, e.g. barrier(timeout=))
 *   bounds every wait of its calls (loomCommSetTimeout). A call that runs
 *   out of time fails with DistBackendError "Timed out waiting <ms>ms ...".
 * - A failure other than an argument error may leave the ranks out of
 *   step: the communicator is aborted there and then (its peers' waits on
 *   this rank end instead of running into their own timeouts), and every
 *   later call on the group raises, naming the first failure.
 * - Coalescing (_coalescing_manager, batch_isend_irecv): the calls between
 *   startCoalescing and endCoalescing run as one ncclGroupStart/End; the
 *   Works they returned complete with endCoalescing's.
 * - One tensor per call (like the MPI backend): a list of several tensors
 *   would mean "replicas on several devices" in torch's old API, which has
 *   no meaning on CPU. allreduce_coalesced takes several distinct tensors.
 * - bool travels as uint8; SUM and MAX on bool are a logical or, PRODUCT
 *   and MIN a logical and (as torch's NCCL backend does). int16 and the
 *   complex types have no NCCL type and are refused (torch's own Python
 *   layer sends complex tensors as real pairs for SUM and AVG).
 * - send/recv ignore the tag (NCCL has none); messages between two ranks
 *   arrive in the order they were sent. recv from any source is refused:
 *   NCCL has no such receive (decision in docs/pytorch.md).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <torch/extension.h>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "loom.h"
#include "loom_api.h"
#include "loom_torch_args.h"
#include "loom_work.h"
#include "nccl.h"

namespace loom_torch {

namespace {
constexpr const char *kBackendName = "loom";
constexpr const char *kUniqueIdKey = "loom_unique_id";
using ms = std::chrono::milliseconds;
} // namespace

class ProcessGroupLoom : public c10d::Backend {
public:
  using Options = c10d::Backend::Options;

  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size, ms timeout)
      : Backend(rank, size), options_(c10::make_intrusive<Options>(kBackendName, timeout)) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank == 0) {
      ncclResult_t r = lm::ncclGetUniqueId(&id);
      TORCH_CHECK(r == ncclSuccess, "loom backend: ncclGetUniqueId failed: ", lm::ncclGetErrorString(r), ": ",
                  lm::ncclGetLastError(nullptr));
      std::vector<uint8_t> bytes(reinterpret_cast<uint8_t *>(&id), reinterpret_cast<uint8_t *>(&id) + sizeof id);
      store->set(kUniqueIdKey, bytes);
    } else {
      std::vector<uint8_t> bytes = store->get(kUniqueIdKey);
      TORCH_CHECK(bytes.size() == sizeof id, "loom backend: the store's ", kUniqueIdKey, " holds ", bytes.size(),
                  " bytes, not the ", sizeof id, " of an ncclUniqueId");
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    // The loom backend is a CPU backend: its communicator is a host one
    // even where this Loom was built with CUDA and sees a GPU. LOOM_DEVICE
    // is read when the communicator is made, so it is set only for that.
    const char *dev = std::getenv("LOOM_DEVICE");
    bool set_dev = dev == nullptr || dev[0] == '\0';
    if (set_dev)
      setenv("LOOM_DEVICE", "host", 1);
    ncclComm_t comm = nullptr;
    ncclResult_t r = lm::ncclCommInitRank(&comm, size, id, rank);
    if (set_dev)
      unsetenv("LOOM_DEVICE");
    TORCH_CHECK(r == ncclSuccess, "loom backend: ncclCommInitRank (rank ", rank, " of ", size,
                ") failed: ", lm::ncclGetErrorString(r), ": ", lm::ncclGetLastError(comm));
    adopt(comm);
  }

  // A group split from another (split()): the communicator is made.
  ProcessGroupLoom(ncclComm_t comm, int rank, int size, c10::intrusive_ptr<Options> opts)
      : Backend(rank, size), options_(std::move(opts)) {
    adopt(comm);
  }

  ~ProcessGroupLoom() override { close(); }

  const std::string getBackendName() const override { return kBackendName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }

  void setTimeout(ms timeout) override { options_->timeout = timeout; }

  c10d::ErrorType getError() override {
    if (!broken_)
      return c10d::ErrorType::SUCCESS;
    return timed_out_ ? c10d::ErrorType::TIMEOUT : c10d::ErrorType::COMM_ERROR;
  }

  uint64_t getSequenceNumberForGroup() override { return seq_; }

  void startCoalescing() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_live();
    TORCH_CHECK(!coalescing_, "loom backend: _start_coalescing called twice without _end_coalescing");
    coalescing_ = true;
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    std::vector<Pending> batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      TORCH_CHECK(coalescing_, "loom backend: _end_coalescing without _start_coalescing");
      coalescing_ = false;
      batch.swap(coalesced_);
    }
    auto all = make_work(c10d::OpType::COALESCED, "loom:coalesced", {}, {});
    LoomJob job;
    job.works.push_back(all);
    ms timeout = options_->timeout;
    for (auto &p : batch) {
      job.works.push_back(p.work);
      if (p.timeout != c10d::kUnsetTimeout)
        timeout = p.timeout;
    }
    job.run = [this, batch = std::move(batch), timeout]() -> std::exception_ptr {
      std::exception_ptr e = begin(timeout);
      if (e)
        return e;
      ncclResult_t r = lm::ncclGroupStart();
      if (r != ncclSuccess)
        return failure(r, "ncclGroupStart (a coalesced group)", timeout);
      for (auto &p : batch) {
        try {
          r = p.calls();
        } catch (...) { // a torch error in a call's own step: the group must still end
          lm::ncclGroupEnd();
          throw;
        }
        if (r != ncclSuccess) {
          lm::ncclGroupEnd();
          return failure(r, c10::str(p.call, " (in a coalesced group)").c_str(), timeout);
        }
      }
      r = lm::ncclGroupEnd();
      return r == ncclSuccess ? nullptr : failure(r, "ncclGroupEnd (ending a coalesced group)", timeout);
    };
    worker_->push(std::move(job));
    return all;
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override {
    check_single(tensors, "broadcast's tensor");
    check_root(opts.rootRank, "broadcast");
    TORCH_CHECK(opts.rootTensor == 0, "loom backend: broadcast's rootTensor must be 0, not ", opts.rootTensor);
    at::Tensor t = tensors[0];
    ncclDataType_t dt = nccl_type(t, "broadcast's tensor");
    int root = (int)opts.rootRank;
    return enqueue(make_work(c10d::OpType::BROADCAST, "loom:broadcast", tensors, tensors), opts.timeout,
                   "ncclBroadcast", [this, t, dt, root] {
                     return lm::ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), dt, root, comm_, nullptr);
                   });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override {
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
      return allreduce_sparse(tensors, opts);
    check_single(tensors, "allreduce's tensor");
    at::Tensor t = tensors[0];
    ncclRedOp_t op = nccl_op(opts.reduceOp, t);
    ncclDataType_t dt = nccl_type(t, "allreduce's tensor");
    return enqueue(
        make_work(c10d::OpType::ALLREDUCE, "loom:all_reduce", tensors, tensors), opts.timeout, "ncclAllReduce",
        [this, t, dt, op] { return lm::ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, op, comm_, nullptr); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor> &tensors,
                                                  const c10d::AllreduceOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                     const c10d::AllreduceCoalescedOptions &opts) override {
    TORCH_CHECK(!tensors.empty(), "loom backend: allreduce_coalesced needs at least one tensor");
    std::vector<ncclRedOp_t> ops;
    std::vector<ncclDataType_t> dts;
    for (auto &t : tensors) {
      check_tensor(t, "an allreduce_coalesced tensor");
      ops.push_back(nccl_op(opts.reduceOp, t));
      dts.push_back(nccl_type(t, ""));
    }
    std::vector<at::Tensor> ts = tensors;
    return enqueue(make_work(c10d::OpType::ALLREDUCE_COALESCED, "loom:all_reduce_coalesced", tensors, tensors),
                   opts.timeout, "ncclAllReduce (allreduce_coalesced)", [this, ts, ops, dts] {
                     return grouped([&]() -> ncclResult_t {
                       for (size_t i = 0; i < ts.size(); i++) {
                         ncclResult_t r = lm::ncclAllReduce(ts[i].data_ptr(), ts[i].data_ptr(), ts[i].numel(), dts[i],
                                                            ops[i], comm_, nullptr);
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
    at::Tensor t = tensors[0];
    ncclRedOp_t op = nccl_op(opts.reduceOp, t);
    ncclDataType_t dt = nccl_type(t, "reduce's tensor");
    int root = (int)opts.rootRank;
    return enqueue(make_work(c10d::OpType::REDUCE, "loom:reduce", tensors, tensors), opts.timeout, "ncclReduce",
                   [this, t, dt, op, root] {
                     return lm::ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, op, root, comm_, nullptr);
                   });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override {
    check_single(inputs, "allgather's input");
    TORCH_CHECK(outputs.size() == 1, "loom backend: allgather takes one list of output tensors, not ", outputs.size());
    at::Tensor in = inputs[0];
    auto outs = outputs[0];
    TORCH_CHECK((int)outs.size() == size_, "loom backend: allgather's output list has ", outs.size(),
                " tensors but the group has ", size_, " ranks");
    for (auto &o : outs) {
      check_tensor(o, "an allgather output");
      check_like(o, in, "an allgather output", "the input");
    }
    ncclDataType_t dt = nccl_type(in, "allgather's input");
    at::Tensor flat = at::empty({(int64_t)size_ * in.numel()}, in.options());
    auto work = make_work(c10d::OpType::ALLGATHER, "loom:all_gather", outs, inputs);
    work->keep = {flat};
    work->post = [flat, outs, n = in.numel()]() mutable {
      for (size_t r = 0; r < outs.size(); r++)
        outs[r].view({-1}).copy_(flat.narrow(0, (int64_t)r * n, n));
    };
    return enqueue(work, opts.timeout, "ncclAllGather", [this, in, flat, dt] {
      return lm::ncclAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), dt, comm_, nullptr);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override {
    check_tensor(input, "all_gather_into_tensor's input");
    check_tensor(output, "all_gather_into_tensor's output");
    check_same_type(output, input, "all_gather_into_tensor's output", "its input");
    TORCH_CHECK(output.numel() == (int64_t)size_ * input.numel(), "loom backend: all_gather_into_tensor's output has ",
                output.numel(), " elements but must have ", size_, " (ranks) x ", input.numel(),
                " (the input's) = ", (int64_t)size_ * input.numel());
    ncclDataType_t dt = nccl_type(input, "");
    at::Tensor in = input, out = output;
    return enqueue(make_work(c10d::OpType::_ALLGATHER_BASE, "loom:all_gather_into_tensor", {output}, {input}),
                   opts.timeout, "ncclAllGather", [this, in, out, dt] {
                     return lm::ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), dt, comm_, nullptr);
                   });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                 std::vector<at::Tensor> &inputs,
                                                                 const c10d::AllgatherOptions &opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "loom backend: all_gather_into_tensor_coalesced has ", outputs.size(),
                " outputs but ", inputs.size(), " inputs");
    std::vector<ncclDataType_t> dts;
    for (size_t i = 0; i < inputs.size(); i++) {
      check_tensor(inputs[i], "an all_gather_into_tensor_coalesced input");
      check_tensor(outputs[i], "an all_gather_into_tensor_coalesced output");
      check_same_type(outputs[i], inputs[i], "an all_gather_into_tensor_coalesced output", "its input");
      TORCH_CHECK(outputs[i].numel() == (int64_t)size_ * inputs[i].numel(), "loom backend: output ", i,
                  " of all_gather_into_tensor_coalesced has ", outputs[i].numel(), " elements but must have ", size_,
                  " x ", inputs[i].numel());
      dts.push_back(nccl_type(inputs[i], ""));
    }
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(make_work(c10d::OpType::COALESCED, "loom:all_gather_into_tensor_coalesced", outputs, inputs),
                   opts.timeout, "ncclAllGather (all_gather_into_tensor_coalesced)", [this, ins, outs, dts] {
                     return grouped([&]() -> ncclResult_t {
                       for (size_t i = 0; i < ins.size(); i++) {
                         ncclResult_t r = lm::ncclAllGather(ins[i].data_ptr(), outs[i].data_ptr(), ins[i].numel(),
                                                            dts[i], comm_, nullptr);
                         if (r != ncclSuccess)
                           return r;
                       }
                       return ncclSuccess;
                     });
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
      TORCH_CHECK(outputs[r].size() == inputs.size(), "loom backend: all_gather_coalesced's output list for rank ", r,
                  " has ", outputs[r].size(), " tensors but there are ", inputs.size(), " inputs");
    std::vector<at::Tensor> flats, ins = inputs;
    std::vector<ncclDataType_t> dts;
    for (size_t i = 0; i < inputs.size(); i++) {
      check_tensor(inputs[i], "an all_gather_coalesced input");
      for (size_t r = 0; r < outputs.size(); r++) {
        check_tensor(outputs[r][i], "an all_gather_coalesced output");
        check_like(outputs[r][i], inputs[i], "an all_gather_coalesced output", "its input");
      }
      dts.push_back(nccl_type(inputs[i], ""));
      flats.push_back(at::empty({(int64_t)size_ * inputs[i].numel()}, inputs[i].options()));
    }
    std::vector<at::Tensor> flat_outs;
    for (auto &l : outputs)
      flat_outs.insert(flat_outs.end(), l.begin(), l.end());
    auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, "loom:all_gather_coalesced", flat_outs, inputs);
    work->keep = flats;
    work->post = [flats, outs = outputs, ins]() mutable {
      for (size_t i = 0; i < ins.size(); i++) {
        int64_t n = ins[i].numel();
        for (size_t r = 0; r < outs.size(); r++)
          outs[r][i].view({-1}).copy_(flats[i].narrow(0, (int64_t)r * n, n));
      }
    };
    return enqueue(work, opts.timeout, "ncclAllGather (all_gather_coalesced)", [this, ins, flats, dts] {
      return grouped([&]() -> ncclResult_t {
        for (size_t i = 0; i < ins.size(); i++) {
          ncclResult_t r =
              lm::ncclAllGather(ins[i].data_ptr(), flats[i].data_ptr(), ins[i].numel(), dts[i], comm_, nullptr);
          if (r != ncclSuccess)
            return r;
        }
        return ncclSuccess;
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override {
    check_single(outputs, "reduce_scatter's output");
    TORCH_CHECK(inputs.size() == 1, "loom backend: reduce_scatter takes one list of input tensors, not ",
                inputs.size());
    at::Tensor out = outputs[0];
    auto &ins = inputs[0];
    TORCH_CHECK((int)ins.size() == size_, "loom backend: reduce_scatter's input list has ", ins.size(),
                " tensors but the group has ", size_, " ranks");
    for (auto &i : ins) {
      check_tensor(i, "a reduce_scatter input");
      check_like(i, out, "a reduce_scatter input", "the output");
    }
    ncclRedOp_t op = nccl_op(opts.reduceOp, out);
    ncclDataType_t dt = nccl_type(out, "");
    std::vector<at::Tensor> views;
    for (auto &i : ins)
      views.push_back(i.view({-1}));
    at::Tensor flat = at::cat(views);
    auto work = make_work(c10d::OpType::REDUCE_SCATTER, "loom:reduce_scatter", outputs, ins);
    work->keep = {flat};
    return enqueue(work, opts.timeout, "ncclReduceScatter", [this, flat, out, dt, op] {
      return lm::ncclReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), dt, op, comm_, nullptr);
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
    ncclDataType_t dt = nccl_type(output, "");
    at::Tensor in = input, out = output;
    return enqueue(make_work(c10d::OpType::_REDUCE_SCATTER_BASE, "loom:reduce_scatter_tensor", {output}, {input}),
                   opts.timeout, "ncclReduceScatter", [this, in, out, dt, op] {
                     return lm::ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), dt, op, comm_, nullptr);
                   });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                                                 std::vector<at::Tensor> &inputs,
                                                                 const c10d::ReduceScatterOptions &opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "loom backend: reduce_scatter_tensor_coalesced has ", outputs.size(),
                " outputs but ", inputs.size(), " inputs");
    std::vector<ncclDataType_t> dts;
    std::vector<ncclRedOp_t> ops;
    for (size_t i = 0; i < inputs.size(); i++) {
      check_tensor(inputs[i], "a reduce_scatter_tensor_coalesced input");
      check_tensor(outputs[i], "a reduce_scatter_tensor_coalesced output");
      check_same_type(outputs[i], inputs[i], "a reduce_scatter_tensor_coalesced output", "its input");
      TORCH_CHECK(inputs[i].numel() == (int64_t)size_ * outputs[i].numel(), "loom backend: input ", i,
                  " of reduce_scatter_tensor_coalesced has ", inputs[i].numel(), " elements but must have ", size_,
                  " x ", outputs[i].numel());
      dts.push_back(nccl_type(outputs[i], ""));
      ops.push_back(nccl_op(opts.reduceOp, outputs[i]));
    }
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(make_work(c10d::OpType::COALESCED, "loom:reduce_scatter_tensor_coalesced", outputs, inputs),
                   opts.timeout, "ncclReduceScatter (reduce_scatter_tensor_coalesced)", [this, ins, outs, dts, ops] {
                     return grouped([&]() -> ncclResult_t {
                       for (size_t i = 0; i < ins.size(); i++) {
                         ncclResult_t r = lm::ncclReduceScatter(ins[i].data_ptr(), outs[i].data_ptr(), outs[i].numel(),
                                                                dts[i], ops[i], comm_, nullptr);
                         if (r != ncclSuccess)
                           return r;
                       }
                       return ncclSuccess;
                     });
                   });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &outputSplitSizes,
                                               std::vector<int64_t> &inputSplitSizes,
                                               const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
                                        const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dstRank, int /* tag */) override {
    check_single(tensors, "send's tensor");
    check_peer(dstRank, "send");
    at::Tensor t = tensors[0];
    ncclDataType_t dt = nccl_type(t, "send's tensor");
    return enqueue(
        make_work(c10d::OpType::SEND, "loom:send", {}, tensors), c10d::kUnsetTimeout, "ncclSend",
        [this, t, dt, dstRank] { return lm::ncclSend(t.data_ptr(), t.numel(), dt, dstRank, comm_, nullptr); });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int srcRank, int /* tag */) override {
    check_single(tensors, "recv's tensor");
    check_peer(srcRank, "recv");
    at::Tensor t = tensors[0];
    ncclDataType_t dt = nccl_type(t, "recv's tensor");
    return enqueue(
        make_work(c10d::OpType::RECV, "loom:recv", tensors, {}), c10d::kUnsetTimeout, "ncclRecv",
        [this, t, dt, srcRank] { return lm::ncclRecv(t.data_ptr(), t.numel(), dt, srcRank, comm_, nullptr); });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> & /* tensors */, int /* tag */) override {
    TORCH_CHECK(false, "loom backend: recv without a source rank is not supported (NCCL has no receive from any "
                       "rank): name the source");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override {
    return enqueue(
        make_work(c10d::OpType::BARRIER, "loom:barrier", {}, {}), opts.timeout, "ncclAllReduce (barrier)",
        [this] { return lm::ncclAllReduce(&barrier_byte_, &barrier_byte_, 1, ncclUint8, ncclSum, comm_, nullptr); });
  }

  // split_group: every rank of this group calls it, for the group of
  // (sorted) ranks it belongs to, or for another when it belongs to none;
  // those get no group (nullptr, as torch expects).
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store> & /* store */,
                                          const std::vector<int> &ranks,
                                          const c10::intrusive_ptr<Options> &opts) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    bool member = it != ranks.end();
    for (int r : ranks)
      TORCH_CHECK(r >= 0 && r < size_, "loom backend: split names rank ", r, ", not a rank of this group of ", size_);
    int color = member ? *std::min_element(ranks.begin(), ranks.end()) : NCCL_SPLIT_NOCOLOR;
    int key = member ? (int)(it - ranks.begin()) : 0;
    auto child = std::make_shared<ncclComm_t>(nullptr);
    // ncclCommSplit is a call on this group's communicator: it takes its
    // place in the queue, and the caller waits for it.
    auto work =
        enqueue(make_work(c10d::OpType::UNKNOWN, "loom:split", {}, {}), c10d::kUnsetTimeout, "ncclCommSplit",
                [this, color, key, child] { return lm::ncclCommSplit(comm_, color, key, child.get(), nullptr); });
    work->wait();
    if (!member)
      return nullptr;
    TORCH_CHECK(*child != nullptr, "loom backend: ncclCommSplit made no communicator for rank ", rank_);
    // A copy: the child's timeout is its own (setTimeout on one group must
    // not change another's).
    auto o = c10::make_intrusive<Options>(opts ? *opts : *options_);
    return c10::make_intrusive<ProcessGroupLoom>(*child, key, (int)ranks.size(), o);
  }

  // Ends the communicator at once (ncclCommAbort): a call in progress on
  // the worker returns with an error, and the queued ones fail.
  void abort() override {
    mark_broken("the process group was aborted (abort())", false);
    ncclComm_t c = comm_.exchange(nullptr);
    if (c != nullptr)
      lm::ncclCommAbort(c);
  }

  // destroy_process_group: what was queued runs, then the communicator ends.
  void shutdown() override { close(); }

  // For tests and diagnostics: the transport to a peer, as Loom names it.
  std::string peerTransport(int peer) {
    const char *name = nullptr;
    ncclComm_t c = comm_.load();
    if (c == nullptr || lm::loomCommPeerTransport(c, peer, &name) != ncclSuccess || name == nullptr)
      return "unknown";
    return name;
  }

  static c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                                                  const std::chrono::duration<float> &timeout) {
    return c10::make_intrusive<ProcessGroupLoom>(store, rank, size, std::chrono::duration_cast<ms>(timeout));
  }

private:
  // One queued call during coalescing.
  struct Pending {
    c10::intrusive_ptr<LoomWork> work;
    std::function<ncclResult_t()> calls;
    std::string call;
    ms timeout;
  };

  void adopt(ncclComm_t comm) {
    int is_host = 0;
    if (lm::loomCommIsHost(comm, &is_host) != ncclSuccess || !is_host) {
      lm::ncclCommAbort(comm);
      TORCH_CHECK(false, "loom backend: Loom made a CUDA communicator, but the loom backend needs a host one");
    }
    comm_ = comm;
    worker_ = std::make_unique<LoomWorker>();
  }

  void close() {
    worker_.reset(); // runs what is queued
    ncclComm_t c = comm_.exchange(nullptr);
    if (c == nullptr)
      return;
    if (broken_)
      lm::ncclCommAbort(c);
    else
      lm::ncclCommDestroy(c);
  }

  void check_live() {
    if (!broken_ && comm_.load() != nullptr)
      return;
    TORCH_CHECK(false, unusable());
  }

  // Why calls on this group are refused.
  std::string unusable() {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_msg_.empty())
      return "loom backend: this process group was shut down (destroy_process_group)";
    return c10::str("loom backend: this process group's communicator was aborted after an earlier failure: ",
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
              std::vector<int64_t> &off);

  ncclResult_t exchange(const at::Tensor &in, const std::vector<int64_t> &scount, const std::vector<int64_t> &soff,
                        const at::Tensor &out, const std::vector<int64_t> &rcount, const std::vector<int64_t> &roff);

  // Runs calls inside ncclGroupStart/End; the first failure is the result.
  template <typename F> ncclResult_t grouped(F &&calls) {
    ncclResult_t r = lm::ncclGroupStart();
    if (r != ncclSuccess)
      return r;
    ncclResult_t rc;
    try {
      rc = calls();
    } catch (...) {
      lm::ncclGroupEnd();
      throw;
    }
    ncclResult_t re = lm::ncclGroupEnd();
    return rc != ncclSuccess ? rc : re;
  }

  c10::intrusive_ptr<LoomWork> make_work(c10d::OpType type, const char *title, const std::vector<at::Tensor> &outs,
                                         const std::vector<at::Tensor> &ins) {
    return c10::make_intrusive<LoomWork>(rank_, type, title, outs, ins);
  }

  // Queues the calls for the worker (or, while coalescing, for
  // endCoalescing's group) and returns the Work they complete.
  c10::intrusive_ptr<c10d::Work> enqueue(c10::intrusive_ptr<LoomWork> work, ms timeout, const char *call,
                                         std::function<ncclResult_t()> calls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_live();
      seq_++;
      if (coalescing_) {
        coalesced_.push_back(Pending{work, std::move(calls), call, timeout});
        return work;
      }
    }
    if (timeout == c10d::kUnsetTimeout)
      timeout = options_->timeout;
    LoomJob job;
    job.works.push_back(work);
    job.run = [this, calls = std::move(calls), call = std::string(call), timeout]() -> std::exception_ptr {
      std::exception_ptr e = begin(timeout);
      if (e)
        return e;
      ncclResult_t r = calls();
      return r == ncclSuccess ? nullptr : failure(r, call.c_str(), timeout);
    };
    worker_->push(std::move(job));
    return work;
  }

  // On the worker, before a job's calls: refuses them on a broken group,
  // and gives the communicator the job's time bound.
  std::exception_ptr begin(ms timeout) {
    if (broken_ || comm_.load() == nullptr)
      return make_error(unusable());
    if (timeout != comm_timeout_) {
      // Loom takes 1 ms to 1e9 s; torch's timedelta may be 0 or huge.
      double s = std::min(std::max(timeout.count() / 1000.0, 0.001), 1e9);
      ncclResult_t r = lm::loomCommSetTimeout(comm_, s);
      if (r != ncclSuccess)
        return failure(r, "loomCommSetTimeout", timeout);
      comm_timeout_ = timeout;
    }
    return nullptr;
  }

  static std::exception_ptr make_error(const std::string &msg) {
    return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
  }

  void mark_broken(const std::string &msg, bool timed_out) {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_)
      return;
    broken_msg_ = msg;
    timed_out_ = timed_out;
    broken_ = true;
  }

  // The exception for a failed call, with Loom's sentence. After any
  // failure but an argument error the communicator is aborted at once.
  std::exception_ptr failure(ncclResult_t r, const char *call, ms timeout) {
    const char *last = lm::ncclGetLastError(comm_);
    std::string why = last && last[0] ? last : "(no detail)";
    bool timed_out = why.find("timed out") != std::string::npos;
    std::string msg = timed_out ? c10::str("loom backend: Timed out waiting ", timeout.count(), "ms for ", call,
                                           " on rank ", rank_, " of ", size_, ": ", why)
                                : c10::str("loom backend: ", call, " failed on rank ", rank_, " of ", size_, ": ",
                                           lm::ncclGetErrorString(r), ": ", why);
    if (r != ncclInvalidArgument) {
      mark_broken(msg, timed_out);
      ncclComm_t c = comm_.exchange(nullptr);
      if (c != nullptr)
        lm::ncclCommAbort(c);
    }
    return make_error(msg);
  }

  c10::intrusive_ptr<Options> options_;
  std::atomic<ncclComm_t> comm_{nullptr};
  std::unique_ptr<LoomWorker> worker_;
  std::mutex mu_; // coalescing_, coalesced_
  bool coalescing_ = false;
  std::vector<Pending> coalesced_;
  std::atomic<uint64_t> seq_{0};
  std::mutex broken_mu_;
  std::atomic<bool> broken_{false};
  bool timed_out_ = false;
  std::string broken_msg_;
  ms comm_timeout_{-2}; // the worker's: the bound last given to Loom
  uint8_t barrier_byte_ = 0;
};

} // namespace loom_torch

#include "loom_torch_p2p.h"
#include "loom_torch_sparse.h"

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  m.doc() = "Loom's torch.distributed backend (ProcessGroupLoom); import loom_torch to register it";
  lm::table(); // Loom's library, loaded now: a failure is the import's
  py::module_::import("torch.distributed");
  py::class_<loom_torch::ProcessGroupLoom, c10d::Backend, c10::intrusive_ptr<loom_torch::ProcessGroupLoom>>(
      m, "ProcessGroupLoom")
      .def(py::init(
               [](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size, std::chrono::milliseconds timeout) {
                 return c10::make_intrusive<loom_torch::ProcessGroupLoom>(store, rank, size, timeout);
               }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout") = kBackendDefaultTimeout,
           py::call_guard<py::gil_scoped_release>())
      .def("peer_transport", &loom_torch::ProcessGroupLoom::peerTransport, py::arg("peer"));
  m.def("create_process_group", &loom_torch::ProcessGroupLoom::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "The backend's creator: (store, rank, size, timeout) -> ProcessGroupLoom");
  m.def("nccl_version", []() {
    int v = 0;
    lm::ncclGetVersion(&v);
    return v;
  });
  m.def("transports", []() { return std::string(lm::loomTransports()); });
  m.def(
      "library_path", []() { return lm::table().path; }, "The Loom library the backend loaded");
}
