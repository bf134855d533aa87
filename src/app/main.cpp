// meshtron: one MPI program, several subcommands.
//
//   mpirun -np 8 meshtron info  input_decks/gpt-tiny.deck --set parallel.tensor_parallel=2
//   mpirun -np 4 meshtron train input_decks/gpt-tiny.deck
//   mpirun -np 4 meshtron train input_decks/gpt-tiny.deck my-run.deck --set training.train_iters=50
//   mpirun -np 4 meshtron evaluate input_decks/gpt-tiny.deck --set checkpoint.load=auto
//   mpirun -np 4 meshtron generate input_decks/gpt-tiny.deck --set checkpoint.load=auto
//       --set generate.prompts=prompts.jsonl
//   mpirun -np 2 meshtron serve input_decks/gpt-tiny.deck --set checkpoint.load=auto
//
// Errors in user input are detected identically on every rank; they are
// printed once (rank 0) as one line and every rank exits with status 1.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <malloc.h>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "common/error.hpp"

namespace {

void print_usage() {
  std::puts(
      "usage: meshtron <command> [args]\n"
      "  info  DECK... [--set section.key=value ...] [--help-deck]\n"
      "        print the resolved deck and the rank map\n"
      "  train DECK... [--set section.key=value ...]\n"
      "        train the model the deck describes\n"
      "  evaluate DECK... [--set section.key=value ...]\n"
      "        loss and perplexity of checkpoint.load on evaluate.split or evaluate.inputs\n"
      "  generate DECK... [--set section.key=value ...]\n"
      "        text from checkpoint.load for generate.prompts (greedy, sampled or beam)\n"
      "  serve DECK... [--set section.key=value ...]\n"
      "        OpenAI-compatible completions server (HTTP on rank 0, serve.host:serve.port)\n"
      "  preprocess --input FILE... --output-prefix P --tokenizer gpt2 ...\n"
      "        tokenize text into an indexed dataset (preprocess --help)\n"
      "  inspect CKPT.h5\n"
      "        print a checkpoint's state, tensors and checksum status\n"
      "  convert --from hf DIR --to CKPT_DIR | --from CKPT.h5 --to hf DIR\n"
      "        Hugging Face GPT-2 / Llama / Mistral / GPTBigCode / BLOOM / GPT-NeoX / T5 / mT5 /\n"
      "        MegatronBertForPreTraining / BertForPreTraining <-> meshtron checkpoint and model.deck (one rank)\n"
      "  jobscript DECK... --scheduler slurm|pbs --nodes N --gpus-per-node G | --ntasks-per-node T\n"
      "        [--time HH:MM:SS] [--account A] [--partition P] [--output FILE] [--sweep weak|strong --points 1,2,4]\n"
      "        write a batch script that trains the deck, saves ahead of the walltime and resumes (one rank)\n"
      "  scaling-report RUN_DIR... [--output DIR]\n"
      "        table (markdown, CSV) and gnuplot plots of a scaling sweep's runs (one rank)\n"
      "  plan DECK... [--set ...] [--gpus N] [--gpu-memory GiB] [--nodes N] [--search] [--rates FILE]\n"
      "        memory per rank, communication, bubble and step time; --search ranks layouts\n"
      "  plan --calibrate [DECK...] [--rates FILE]\n"
      "        measure GEMM, attention, memory and all-reduce rates into a rates file\n"
      "DECK...: one or more decks; a key takes the value of the last deck that\n"
      "sets it, and --set overrides every deck.\n"
      "Launch through MPI: mpirun -np N meshtron ... or srun meshtron ...");
}

int dispatch(const std::string& command, const std::vector<std::string>& args) {
  if (command == "info") return meshtron::app::run_info(args);
  if (command == "train") return meshtron::app::run_train(args);
  if (command == "evaluate") return meshtron::app::run_evaluate(args);
  if (command == "generate") return meshtron::app::run_generate(args);
  if (command == "serve") return meshtron::app::run_serve(args);
  if (command == "preprocess") return meshtron::app::run_preprocess(args);
  if (command == "inspect") return meshtron::app::run_inspect(args);
  if (command == "convert") return meshtron::app::run_convert(args);
  if (command == "jobscript") return meshtron::app::run_jobscript(args);
  if (command == "scaling-report") return meshtron::app::run_scaling_report(args);
  if (command == "plan") return meshtron::app::run_plan(args);
  throw meshtron::UserError("unknown command '" + command +
                            "' (run meshtron --help for the list)");
}

/// Host tensors of a training step (logits, their gradient: tens of MB) are
/// freed and allocated again every micro-batch. glibc serves blocks that
/// large with fresh mmap()s, so every step paid page faults and page zeroing
/// (about 10 % of a CPU step). Serving them from the heap and never trimming
/// it keeps the pages: the heap settles at the step's peak, like the device
/// caching allocator.
void keep_freed_host_memory() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_host_memory();
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    if (rank == 0) print_usage();
    MPI_Finalize();
    return argc < 2 ? 1 : 0;
  }
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos;
    try {
      status = dispatch(argv[1], std::vector<std::string>(argv + 2, argv + argc));
    } catch (const meshtron::UserError& e) {
      if (rank == 0) std::fprintf(stderr, "meshtron: error: %s\n", e.what());
      status = 1;
    } catch (const std::exception& e) {
      meshtron::fatal(std::string("unexpected exception: ") + e.what(), __FILE__, __LINE__);
    }
  }
  MPI_Finalize();
  return status;
}
