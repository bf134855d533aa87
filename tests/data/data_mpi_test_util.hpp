// Helpers shared by the data tests that run on several ranks: a dataset in a
// folder every rank sees, and a check that a value agrees across ranks.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/mpi_test_util.hpp"
#include "data_test_util.hpp"

namespace meshtron::data::testing {

/// A folder every rank sees (one host): named after rank 0's pid, created by
/// rank 0 with the documents of documents() in it, removed by rank 0 at the
/// end.
class SharedDataset : public ::testing::Test {
 protected:
  /// The documents written; by default 80 one-sequence documents.
  virtual Documents documents() const { return random_documents(80, 1, 300, 50000, 8); }

  void SetUp() override {
    long pid = long(::getpid());
    MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    dir_ = std::filesystem::temp_directory_path() / ("meshtron_data_mpi_" + std::to_string(pid));
    prefix_ = (dir_ / "data").string();
    if (testing_util::world_rank() == 0) {
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      write_documents(prefix_, TokenDType::U16, documents());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    data_ = std::make_shared<IndexedDataset>(prefix_);
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (testing_util::world_rank() == 0) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::string prefix_;
  std::shared_ptr<const IndexedDataset> data_;
};

/// True on every rank iff `values` is the same on every rank.
template <class T>
bool same_on_all_ranks(const std::vector<T>& values) {
  long long hash[2] = {0, 0};
  for (T v : values) hash[0] = hash[0] * 1000003 + (long long)v;
  hash[1] = -hash[0];
  long long max[2];
  MPI_Allreduce(hash, max, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return max[0] == hash[0] && max[1] == hash[1];  // max == min
}

}  // namespace meshtron::data::testing
