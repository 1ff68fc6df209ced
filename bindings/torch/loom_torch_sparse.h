/*
 * The loom backend's AllReduce of sparse (COO) tensors, the way gloo does
 * it: every rank's nonzero count, then its indices and values (padded to
 * the largest count), gathered by every rank, summed locally by coalesce().
 * Only SUM, as with gloo. Included at the end of loom_torch.cpp only.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TORCH_SPARSE_H
#define LOOM_TORCH_SPARSE_H

namespace loom_torch {

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce_sparse(std::vector<at::Tensor> &tensors,
                                                                  const c10d::AllreduceOptions &opts) {
  TORCH_CHECK(tensors.size() == 1, "loom backend: a sparse all_reduce takes exactly one tensor per call, not ",
              tensors.size());
  at::Tensor in = tensors[0];
  TORCH_CHECK(in.defined() && in.layout() == at::kSparse, "loom backend: allreduce_sparse takes a sparse COO tensor");
  TORCH_CHECK(in.device().is_cpu(), "loom backend: the sparse all_reduce's tensor is on ", in.device(),
              "; the loom backend takes CPU tensors only");
  auto op = static_cast<c10d::ReduceOp::RedOpType>(opts.reduceOp);
  TORCH_CHECK(op == c10d::ReduceOp::SUM, "loom backend: a sparse all_reduce supports ReduceOp.SUM only, not ",
              op_name(op));
  ncclDataType_t vdt = nccl_type(in, "the sparse all_reduce's tensor");
  int n = size_;
  return enqueue(make_work(c10d::OpType::_ALLREDUCE_SPARSE, "loom:all_reduce_sparse", tensors, tensors), opts.timeout,
                 "ncclAllGather (sparse all_reduce)", [this, in, vdt, n]() mutable -> ncclResult_t {
                   at::Tensor t = in.coalesce();
                   at::Tensor idx = t._indices().contiguous();
                   at::Tensor val = t._values().contiguous();
                   int64_t nnz = t._nnz();
                   at::Tensor counts = at::empty({n}, at::kLong);
                   at::Tensor mine = at::full({1}, nnz, at::kLong);
                   ncclResult_t r = lm::ncclAllGather(mine.data_ptr(), counts.data_ptr(), 1, ncclInt64, comm_, nullptr);
                   if (r != ncclSuccess)
                     return r;
                   int64_t most = counts.max().item<int64_t>();
                   if (most == 0) // every rank's tensor is all zeros: so is the sum
                     return ncclSuccess;
                   int64_t sd = idx.size(0);
                   std::vector<int64_t> vshape = val.sizes().vec();
                   vshape[0] = most;
                   at::Tensor pidx = at::zeros({sd, most}, idx.options());
                   at::Tensor pval = at::zeros(vshape, val.options());
                   pidx.narrow(1, 0, nnz).copy_(idx);
                   pval.narrow(0, 0, nnz).copy_(val);
                   std::vector<int64_t> gshape = vshape;
                   gshape.insert(gshape.begin(), n);
                   at::Tensor gidx = at::empty({n, sd, most}, idx.options());
                   at::Tensor gval = at::empty(gshape, val.options());
                   r = grouped([&]() -> ncclResult_t {
                     ncclResult_t q =
                         lm::ncclAllGather(pidx.data_ptr(), gidx.data_ptr(), pidx.numel(), ncclInt64, comm_, nullptr);
                     if (q == ncclSuccess)
                       q = lm::ncclAllGather(pval.data_ptr(), gval.data_ptr(), pval.numel(), vdt, comm_, nullptr);
                     return q;
                   });
                   if (r != ncclSuccess)
                     return r;
                   std::vector<at::Tensor> is, vs;
                   for (int p = 0; p < n; p++) {
                     int64_t c = counts[p].item<int64_t>();
                     is.push_back(gidx[p].narrow(1, 0, c));
                     vs.push_back(gval[p].narrow(0, 0, c));
                   }
                   at::Tensor sum = at::sparse_coo_tensor(at::cat(is, 1), at::cat(vs, 0), t.sizes(), t.options());
                   in.copy_(sum.coalesce());
                   return ncclSuccess;
                 });
}

} // namespace loom_torch

#endif
