// What the Hugging Face interop tests of tests/convert share: a scratch
// folder per test, random tensors from a seeded stream, zero-valued
// parameters of given names and shapes, and one element of a matrix.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/parameter.hpp"
#include "tensor/tensor.hpp"

namespace meshtron::testing_util {

/// A fixture owning an empty folder unique to this process and test suite,
/// removed after each test.
class ScratchFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string suite =
        ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name();
    dir = std::filesystem::temp_directory_path() /
          ("meshtron_" + suite + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::string file(const std::string& name) const { return (dir / name).string(); }
  /// Writes `text` to the file `name` of the folder.
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
  }
  /// Writes `text` as the config.json of the subfolder `name`.
  void write_config(const std::string& name, const std::string& text) const {
    std::filesystem::create_directories(dir / name);
    write(name + "/config.json", text);
  }

  std::filesystem::path dir;
};

/// F32 tensors of standard normal values drawn in turn from one seeded
/// stream: the same seed and shapes give the same tensors.
class RandomTensors {
 public:
  explicit RandomTensors(unsigned seed) : rng_(seed) {}
  Tensor operator()(Shape shape) {
    Tensor x = Tensor::empty(std::move(shape));
    for (index_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist_(rng_);
    return x;
  }

 private:
  std::mt19937 rng_;
  std::normal_distribution<float> dist_;
};

/// Zero-valued parameters as a 1-rank model holds them (names and global
/// shapes); a test derives one that adds the parameters it needs.
struct ZeroParams {
  void add(const std::string& name, Shape shape) {
    Parameter p;
    p.name = name;
    p.global_shape = shape;
    p.value = Tensor::zeros(shape);
    store.push_back(std::move(p));
  }
  ParameterList list() {
    ParameterList out;
    for (Parameter& p : store) out.push_back(&p);
    return out;
  }
  /// The value of the parameter `name`.
  const Tensor& operator[](const std::string& name) const {
    for (const Parameter& p : store)
      if (p.name == name) return p.value;
    throw std::runtime_error("no parameter " + name);
  }
  std::vector<Parameter> store;
};

/// Element (row, col) of a row-major F32 matrix.
inline float at(const Tensor& t, index_t row, index_t col) {
  return t.data<float>()[row * t.dim(1) + col];
}

}  // namespace meshtron::testing_util
