// meshtron info DECK [--set k=v ...]: resolve and validate the deck, build the
// topology, and print both on rank 0.
#include <cstdio>
#include <iostream>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "parallel/topology.hpp"

namespace meshtron::app {

DeckArgs parse_deck_args(const std::vector<std::string>& args) {
  DeckArgs out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--set") {
      MESH_REQUIRE(i + 1 < args.size(), "--set needs section.key=value");
      out.overrides.push_back(args[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      out.overrides.push_back(a.substr(6));
    } else if (a.rfind("--", 0) != 0 && out.deck.empty()) {
      out.deck = a;
    } else {
      out.rest.push_back(a);
    }
  }
  return out;
}

int run_info(const std::vector<std::string>& args) {
  const DeckArgs parsed = parse_deck_args(args);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (const auto& r : parsed.rest) {
    if (r == "--help-deck") {
      if (rank == 0) std::cout << RunConfig::schema_help();
      return 0;
    }
    throw UserError("info: unknown argument '" + r + "'");
  }
  MESH_REQUIRE(!parsed.deck.empty(), "info: missing DECK argument");
  RunConfig config = RunConfig::from_file(parsed.deck, parsed.overrides);
  config.validate(world);
  Topology topo(MPI_COMM_WORLD, config.parallel.degrees());
  const auto rows = gather_rank_map(topo, /*num_gpus=*/0);
  if (rank == 0) {
    std::cout << "deck " << parsed.deck << " (resolved):\n"
              << config.resolved_text() << "\n"
              << "topology: world=" << topo.world_size() << " tp=" << topo.tp()
              << " pp=" << topo.pp() << " dp=" << topo.dp() << "\n"
              << format_rank_map(rows);
  }
  return 0;
}

}  // namespace meshtron::app
