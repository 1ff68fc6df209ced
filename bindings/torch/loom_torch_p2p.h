/*
 * The loom backend's point-to-point family: all_to_all_single (equal or
 * unequal splits), all_to_all, gather and scatter, each a group of
 * ncclSend/ncclRecv run by the group's worker. Included at the end of
 * loom_torch.cpp only.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TORCH_P2P_H
#define LOOM_TORCH_P2P_H

namespace loom_torch {

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                               std::vector<int64_t> &outputSplitSizes,
                                                               std::vector<int64_t> &inputSplitSizes,
                                                               const c10d::AllToAllOptions &opts) {
  check_tensor(input, "all_to_all_single's input");
  check_tensor(output, "all_to_all_single's output");
  check_same_type(output, input, "all_to_all_single's output", "its input");
  std::vector<int64_t> scount, soff, rcount, roff;
  splits(input, inputSplitSizes, "input", scount, soff);
  splits(output, outputSplitSizes, "output", rcount, roff);
  TORCH_CHECK(scount[rank_] == rcount[rank_], "loom backend: all_to_all_single sends ", scount[rank_],
              " elements to its own rank but receives ", rcount[rank_]);
  at::Tensor in = input, out = output;
  return enqueue(make_work(c10d::OpType::ALLTOALL_BASE, "loom:all_to_all_single", {output}, {input}), opts.timeout,
                 "ncclSend/ncclRecv (all_to_all_single)",
                 [this, in, out, scount, soff, rcount, roff] { return exchange(in, scount, soff, out, rcount, roff); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall(std::vector<at::Tensor> &outputs,
                                                          std::vector<at::Tensor> &inputs,
                                                          const c10d::AllToAllOptions &opts) {
  TORCH_CHECK((int)inputs.size() == size_ && (int)outputs.size() == size_, "loom backend: all_to_all takes ", size_,
              " input and ", size_, " output tensors (one per rank), not ", inputs.size(), " and ", outputs.size());
  for (int r = 0; r < size_; r++) {
    check_tensor(inputs[r], "an all_to_all input");
    check_tensor(outputs[r], "an all_to_all output");
    check_same_type(inputs[r], inputs[0], "an all_to_all input", "the first input");
    check_same_type(outputs[r], inputs[0], "an all_to_all output", "the first input");
  }
  TORCH_CHECK(outputs[rank_].numel() == inputs[rank_].numel(), "loom backend: all_to_all's own input has ",
              inputs[rank_].numel(), " elements but its own output ", outputs[rank_].numel());
  ncclDataType_t dt = nccl_type(inputs[0], "");
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(make_work(c10d::OpType::ALLTOALL, "loom:all_to_all", outputs, inputs), opts.timeout,
                 "ncclSend/ncclRecv (all_to_all)", [this, ins, outs, dt] {
                   return grouped([&]() -> ncclResult_t {
                     for (int p = 0; p < size_; p++) {
                       if (p == rank_) {
                         outs[p].view({-1}).copy_(ins[p].view({-1}));
                         continue;
                       }
                       ncclResult_t r = ncclSuccess;
                       if (ins[p].numel() > 0)
                         r = lm::ncclSend(ins[p].data_ptr(), ins[p].numel(), dt, p, comm_, nullptr);
                       if (r == ncclSuccess && outs[p].numel() > 0)
                         r = lm::ncclRecv(outs[p].data_ptr(), outs[p].numel(), dt, p, comm_, nullptr);
                       if (r != ncclSuccess)
                         return r;
                     }
                     return ncclSuccess;
                   });
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::gather(std::vector<std::vector<at::Tensor>> &outputs,
                                                        std::vector<at::Tensor> &inputs,
                                                        const c10d::GatherOptions &opts) {
  check_single(inputs, "gather's input");
  check_root(opts.rootRank, "gather");
  at::Tensor in = inputs[0];
  int root = (int)opts.rootRank;
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == size_,
                "loom backend: gather's root needs one list of ", size_, " output tensors");
    outs = outputs[0];
    for (auto &o : outs) {
      check_tensor(o, "a gather output");
      check_like(o, in, "a gather output", "the input");
    }
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "loom backend: gather's output list is only for the root rank ", root);
  }
  ncclDataType_t dt = nccl_type(in, "gather's input");
  return enqueue(make_work(c10d::OpType::GATHER, "loom:gather", outs, inputs), opts.timeout,
                 "ncclSend/ncclRecv (gather)", [this, in, outs, root, dt] {
                   return grouped([&]() -> ncclResult_t {
                     if (rank_ != root)
                       return lm::ncclSend(in.data_ptr(), in.numel(), dt, root, comm_, nullptr);
                     for (int p = 0; p < size_; p++) {
                       if (p == rank_) {
                         outs[p].copy_(in);
                         continue;
                       }
                       ncclResult_t r = lm::ncclRecv(outs[p].data_ptr(), outs[p].numel(), dt, p, comm_, nullptr);
                       if (r != ncclSuccess)
                         return r;
                     }
                     return ncclSuccess;
                   });
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::scatter(std::vector<at::Tensor> &outputs,
                                                         std::vector<std::vector<at::Tensor>> &inputs,
                                                         const c10d::ScatterOptions &opts) {
  check_single(outputs, "scatter's output");
  check_root(opts.rootRank, "scatter");
  at::Tensor out = outputs[0];
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
  ncclDataType_t dt = nccl_type(out, "scatter's output");
  return enqueue(make_work(c10d::OpType::SCATTER, "loom:scatter", outputs, ins), opts.timeout,
                 "ncclSend/ncclRecv (scatter)", [this, out, ins, root, dt] {
                   return grouped([&]() -> ncclResult_t {
                     if (rank_ != root)
                       return lm::ncclRecv(out.data_ptr(), out.numel(), dt, root, comm_, nullptr);
                     for (int p = 0; p < size_; p++) {
                       if (p == rank_) {
                         out.copy_(ins[p]);
                         continue;
                       }
                       ncclResult_t r = lm::ncclSend(ins[p].data_ptr(), ins[p].numel(), dt, p, comm_, nullptr);
                       if (r != ncclSuccess)
                         return r;
                     }
                     return ncclSuccess;
                   });
                 });
}

// The counts and offsets (in elements) of each rank's part of a tensor
// split along dim 0, equally when sizes is empty.
void ProcessGroupLoom::splits(const at::Tensor &t, const std::vector<int64_t> &sizes, const char *what,
                              std::vector<int64_t> &count, std::vector<int64_t> &off) {
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

ncclResult_t ProcessGroupLoom::exchange(const at::Tensor &in, const std::vector<int64_t> &scount,
                                        const std::vector<int64_t> &soff, const at::Tensor &out,
                                        const std::vector<int64_t> &rcount, const std::vector<int64_t> &roff) {
  ncclDataType_t dt = nccl_type(in, "");
  size_t esz = in.element_size();
  char *sp = static_cast<char *>(in.data_ptr());
  char *rp = static_cast<char *>(out.data_ptr());
  return grouped([&]() -> ncclResult_t {
    for (int p = 0; p < size_; p++) {
      if (p == rank_) {
        if (scount[p] > 0)
          std::memcpy(rp + roff[p] * esz, sp + soff[p] * esz, scount[p] * esz);
        continue;
      }
      ncclResult_t r = ncclSuccess;
      if (scount[p] > 0)
        r = lm::ncclSend(sp + soff[p] * esz, scount[p], dt, p, comm_, nullptr);
      if (r == ncclSuccess && rcount[p] > 0)
        r = lm::ncclRecv(rp + roff[p] * esz, rcount[p], dt, p, comm_, nullptr);
      if (r != ncclSuccess)
        return r;
    }
    return ncclSuccess;
  });
}

} // namespace loom_torch

#endif
