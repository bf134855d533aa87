// meshtron plan DECK... [--set k=v ...] [--gpus N] [--gpu-memory GiB]
//                [--nodes N] [--search] [--rates FILE]
// meshtron plan --calibrate [DECK...] [--rates FILE]
//
// Memory per pipeline rank, communication per group, bubble and step time
// of the deck's layout (plan/memory.hpp, plan/step_time.hpp); --search
// ranks every layout the trainer accepts on N GPUs (plan/search.hpp);
// --calibrate measures this machine's rates and writes them (docs/plan.md).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "ops/ops.hpp"
#include "parallel/communicator.hpp"
#include "parallel/interconnect.hpp"
#include "plan/search.hpp"
#include "tensor/device_allocator.hpp"
#include "train/runtime.hpp"

namespace meshtron::app {

namespace {

struct PlanArgs {
  DeckArgs deck;
  int gpus = 0, nodes = 0;
  double gpu_memory_gib = 0;
  bool search = false, calibrate = false;
  std::string rates;
};

PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  PlanArgs p;
  p.deck = parse_deck_args(args);
  const auto& rest = p.deck.rest;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    auto value = [&]() -> const std::string& {
      MESH_REQUIRE(i + 1 < rest.size(), "plan: " << a << " needs a value");
      return rest[++i];
    };
    auto number = [&](const std::string& v) {
      try {
        return std::stod(v);
      } catch (const std::exception&) {
        throw UserError("plan: " + a + " = '" + v + "' is not a number");
      }
    };
    if (a == "--gpus")
      p.gpus = int(number(value()));
    else if (a == "--nodes")
      p.nodes = int(number(value()));
    else if (a == "--gpu-memory")
      p.gpu_memory_gib = number(value());
    else if (a == "--rates")
      p.rates = value();
    else if (a == "--search")
      p.search = true;
    else if (a == "--calibrate")
      p.calibrate = true;
    else
      throw UserError("plan: unknown argument '" + a + "'");
  }
  return p;
}

std::string default_rates_path(const RunConfig& c) {
  return std::string(MESHTRON_SOURCE_DIR) + "/plan/rates/" +
         (c.run.device == "cuda" ? "h100.json" : "cpu.json");
}

constexpr double kMiB = 1024.0 * 1024.0;

void print_memory(const std::vector<plan::RankMemory>& ranks, double budget) {
  std::cout << "memory per rank, MiB (every tp and dp rank of a stage alike):\n"
            << "  pp layers    params     grads    master   moments   opt-buf  activat. in-flight"
               "    logits workspace     setup      peak\n"
            << std::fixed << std::setprecision(1);
  double peak = 0;
  for (const auto& r : ranks) {
    const std::string where = std::string(r.embedding ? "e" : "") + (r.head ? "h" : "");
    std::cout << "  " << std::setw(2) << r.pp_rank << std::setw(5) << r.layers << std::setw(2)
              << where;
    for (double v :
         {r.parameters, r.gradients, r.master, r.moments, r.optimizer_buffers, r.activations})
      std::cout << std::setw(10) << v / kMiB;
    std::cout << std::setw(10) << r.in_flight;
    for (double v : {r.logits, r.workspace, r.setup_peak, r.peak()})
      std::cout << std::setw(10) << v / kMiB;
    std::cout << (budget > 0 && r.peak() > budget ? "  DOES NOT FIT" : "") << "\n";
    peak = std::max(peak, r.peak());
  }
  std::cout << "  (e: embedding, h: LM head; activations at the schedule's peak with the "
               "(micro-batch, chunk) pairs in flight there; logits: one micro-batch's, "
               "included in activations; setup: while the optimizer builds its buffers)\n"
            << "peak tensor memory (max over ranks): " << std::setprecision(4) << peak / kMiB
            << " MiB\n";
}

void print_step(const plan::StepEstimate& s, const plan::Rates& rates) {
  std::cout << std::fixed << std::setprecision(3) << "communication per step per rank (MiB): tp "
            << s.bytes.tp / kMiB << ", pp " << s.bytes.pp / kMiB << ", dp " << s.bytes.dp / kMiB
            << ", embedding " << s.bytes.embedding / kMiB << "\n"
            << "pipeline bubble " << s.bubble_formula << ": " << std::setprecision(1)
            << 100 * s.bubble
            << " %\n"
            << "step time (rates: " << rates.name << "): " << std::setprecision(2) << 1e3 * s.step_s
            << " ms = compute and tp " << 1e3 * s.compute_s << " (tp " << 1e3 * s.tp_s
            << " of it) + pp " << 1e3 * s.pp_s << " + dp " << 1e3 * s.dp_s << " + optimizer "
            << 1e3 * s.optimizer_s << ", bubble included\n"
            << "  " << std::setprecision(0) << s.tokens_per_s_per_gpu << " tokens/s/GPU, "
            << std::setprecision(1) << s.model_tflops_per_gpu << " TFLOP/s/GPU, MFU "
            << 100 * s.model_tflops_per_gpu * 1e12 / rates.peak_flops << " %\n";
}

int gpus_per_node(const PlanArgs& a, int gpus, const plan::Rates& rates) {
  return a.nodes > 0 ? std::max(1, gpus / a.nodes) : rates.gpus_per_node;
}

void print_search(const RunConfig& base, const PlanArgs& a, const plan::Rates& rates, int gpus) {
  const double budget = (a.gpu_memory_gib > 0 ? a.gpu_memory_gib : rates.memory_gib) * 1024 * kMiB;
  const auto found = plan::search_layouts(base, resolve_vocab(base), gpus, budget, rates,
                                          gpus_per_node(a, gpus, rates));
  MESH_REQUIRE(!found.empty(),
               "plan --search: no layout of this deck is valid on " << gpus << " GPUs");
  if (!found.front().fits) std::cout << "no valid layout fits; the smallest peaks first\n";
  std::cout << found.size() << " valid layouts on " << gpus << " GPUs of " << std::setprecision(1)
            << std::fixed << budget / (1024 * kMiB) << " GiB; the best:\n";
  for (std::size_t i = 0; i < std::min<std::size_t>(5, found.size()); ++i) {
    const auto& k = found[i];
    std::cout << "  " << i + 1 << ". " << plan::layout_name(k.config) << ": "
              << std::setprecision(1) << 1e3 * k.step.step_s << " ms/step, "
              << k.step.model_tflops_per_gpu << " TFLOP/s/GPU, peak " << k.peak_bytes / kMiB
              << " MiB" << (k.fits ? "" : " (does not fit)") << "\n";
  }
  if (found.size() > 1)
    std::cout << "why the first wins over the second:\n" << plan::why_better(found[0], found[1]);
}

/// The GPU links of the machine plan runs on, taken as every node's, and
/// the warnings for the deck's layout placed in order on nodes of
/// `per_node` GPUs (interconnect.hpp).
void print_placement(const RunConfig& c, int gpus, int per_node) {
  const int tp = c.parallel.tensor_parallel, pp = c.parallel.pipeline_parallel;
  const std::optional<GpuLinks> links = read_gpu_links();
  std::cout << describe_gpu_links(links) << "\n";
  const auto rows = planned_rank_map(tp, pp, gpus / (tp * pp), per_node);
  // Host-path ranks have no GPU pairs to check, only their nodes.
  for (const std::string& line :
       tp_placement_warnings(rows, c.run.device == "cuda" ? links : std::nullopt))
    std::cout << line << "\n";
}

/// Seconds per call of `f`, the best of a few after a warm-up.
template <class F>
double best_seconds(F f, MPI_Comm comm, bool device) {
  double best = 1e30;
  for (int k = 0; k < 5; ++k) {
    MPI_Barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    if (device) device::synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k > 0) best = std::min(best, s);
  }
  double worst = best;  // every rank reports the slowest rank's time
  MPI_Allreduce(&best, &worst, 1, MPI_DOUBLE, MPI_MAX, comm);
  return worst;
}

/// Ranks on this rank's node (MPI's shared-memory split).
int ranks_on_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int ranks = 1;
  MPI_Comm_size(node, &ranks);
  MPI_Comm_free(&node);
  return ranks;
}

/// This rank's share of the memory it trains in: the GPU's, or the node's
/// physical memory over the ranks on the node.
double memory_gib_per_rank(bool cuda) {
  const double bytes =
      cuda ? double(device::device_memory_bytes())
           : double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / ranks_on_node();
  return bytes / (1024.0 * 1024 * 1024);
}

/// GEMM (a square one and the attention core's batched [s, d] x [d, s])
/// through the ops layer, and memory bandwidth (a large copy).
void measure_compute(const RunConfig& c, plan::Rates& r) {
  const bool cuda = c.run.device == "cuda";
  const MemorySpace space = cuda ? MemorySpace::Cuda : MemorySpace::Host;
  const DType dtype = compute_dtype(c);
  const index_t n = cuda ? 4096 : 512;
  Tensor a = Tensor::zeros({n, n}, dtype, space), out = Tensor::zeros({n, n}, dtype, space);
  r.gemm_flops = 2.0 * n * n * n /
                 best_seconds([&] { ops::gemm(a, false, a, true, out); }, MPI_COMM_WORLD, cuda);
  const index_t s = 1024, d = 64, heads = cuda ? 32 : 4;
  Tensor q = Tensor::zeros({heads, s, d}, dtype, space),
         scores = Tensor::zeros({heads, s, s}, dtype, space);
  r.attention_flops =
      2.0 * heads * s * s * d /
      best_seconds([&] { ops::gemm_batched(q, false, q, true, scores); }, MPI_COMM_WORLD, cuda);
  const index_t big = cuda ? (index_t(1) << 28) : (index_t(1) << 24);
  Tensor x = Tensor::zeros({big}, DType::F32, space), y = Tensor::zeros({big}, DType::F32, space);
  r.memory_bandwidth = 2.0 * 4 * big / best_seconds([&] { y.copy_from(x); }, MPI_COMM_WORLD, cuda);
}

/// All-reduces of 4 bytes (latency per ring hop) and 64 MiB (bus bandwidth)
/// over all ranks as one group: NCCL on the GPU path, MPI on the host.
plan::Link measure_all_reduce(const RunConfig& c) {
  const bool cuda = c.run.device == "cuda";
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ParallelRuntime rt(MPI_COMM_WORLD, {world, 1, 1}, cuda ? MemorySpace::Cuda : MemorySpace::Host);
  const std::size_t small = 1, large = std::size_t(1) << 24;
  Tensor buf = Tensor::zeros({index_t(large)}, DType::F32, rt.space());
  const auto seconds = [&](std::size_t count) {
    return best_seconds([&] { rt.tp.all_reduce(buf.raw(), count, DType::F32, ReduceOp::Sum); },
                        MPI_COMM_WORLD, cuda);
  };
  const double t_small = seconds(small), t_large = seconds(large);
  const double hops = 2.0 * std::max(world - 1, 1);
  plan::Link link;
  link.latency = t_small / hops;
  link.bandwidth =
      world > 1 ? 4.0 * large * hops / world / std::max(t_large - t_small, 1e-9) : 1e12;
  return link;
}

plan::Rates calibrate(const RunConfig& c) {
  plan::Rates r;
  r.name = "calibrated (" + c.run.device + ", " + c.training.precision + ")";
  r.source = "meshtron plan --calibrate";
  measure_compute(c, r);
  // MFU's peak: logging.peak_tflops where the deck states it, else the GEMM's.
  r.peak_flops = c.logging.peak_tflops > 0 ? c.logging.peak_tflops * 1e12 : r.gemm_flops;
  r.memory_gib = memory_gib_per_rank(c.run.device == "cuda");
  r.gpus_per_node = ranks_on_node();
  r.intra_node = r.inter_node = measure_all_reduce(c);
  return r;
}

}  // namespace

int run_plan(const std::vector<std::string>& args) {
  const PlanArgs a = parse_plan_args(args);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (a.calibrate) {
    const RunConfig c = a.deck.decks.empty() ? RunConfig::from_text("", a.deck.overrides)
                                             : read_decks(a.deck, "plan");
    const plan::Rates r = calibrate(c);
    const std::string path = a.rates.empty() ? "rates.json" : a.rates;
    if (rank == 0) {
      plan::write_rates(r, path);
      std::cout << std::scientific << std::setprecision(3) << "GEMM " << r.gemm_flops
                << " FLOP/s, attention " << r.attention_flops << " FLOP/s, memory "
                << r.memory_bandwidth << " B/s, all-reduce over " << world
                << " ranks: " << r.intra_node.bandwidth << " B/s, " << r.intra_node.latency
                << " s per hop\nwrote " << path << "\n";
    }
    return 0;
  }
  RunConfig c = read_decks(a.deck, "plan");
  const int gpus =
      a.gpus > 0 ? a.gpus
      : c.parallel.data_parallel > 0
          ? c.parallel.tensor_parallel * c.parallel.pipeline_parallel * c.parallel.data_parallel
          : c.parallel.tensor_parallel * c.parallel.pipeline_parallel;
  const plan::Rates rates = plan::read_rates(a.rates.empty() ? default_rates_path(c) : a.rates);
  if (a.search) {
    if (rank == 0) print_search(c, a, rates, gpus);
    return 0;
  }
  c.validate(gpus);
  const ModelSpec model = model_spec_from_deck(c, resolve_vocab(c), c.parallel.tensor_parallel);
  if (rank != 0) return 0;
  std::cout << "plan of " << c.deck_path << " on " << gpus << " ranks: " << plan::layout_name(c)
            << ", schedule " << c.parallel.schedule << ", " << plan::micro_batches_per_step(c)
            << " micro-batches per step, "
            << (c.parallel.distributed_optimizer ? "distributed" : "replicated") << " optimizer\n";
  const double budget = a.gpu_memory_gib * 1024 * kMiB;
  print_memory(plan::plan_memory(c, model), budget);
  const int per_node = gpus_per_node(a, gpus, rates);
  print_step(plan::estimate_step(c, model, rates, per_node), rates);
  print_placement(c, gpus, per_node);
  return 0;
}

}  // namespace meshtron::app
