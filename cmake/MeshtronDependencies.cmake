# Finds meshtron's dependencies. A missing hard dependency stops the
# configure step with the Debian package that provides it.

function(meshtron_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR
      "meshtron needs ${what}; on Debian/Ubuntu install it with: "
      "apt-get install ${package}  (or run tools/setup.sh)")
  endif()
endfunction()

# --- MPI ---------------------------------------------------------------------
find_package(MPI COMPONENTS C CXX)
meshtron_require(MPI_FOUND "MPI (Open MPI)" "libopenmpi-dev openmpi-bin")

# --- parallel HDF5 -----------------------------------------------------------
# Debian installs the MPI build beside the serial one; prefer it.
if(NOT HDF5_ROOT AND EXISTS "/usr/lib/x86_64-linux-gnu/hdf5/openmpi")
  set(HDF5_ROOT "/usr/lib/x86_64-linux-gnu/hdf5/openmpi")
endif()
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 COMPONENTS C)
meshtron_require(HDF5_FOUND "parallel HDF5" "libhdf5-openmpi-dev")
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "meshtron needs the MPI build of HDF5 (found a serial "
    "one at ${HDF5_INCLUDE_DIRS}); apt-get install libhdf5-openmpi-dev")
endif()
add_library(meshtron::hdf5 INTERFACE IMPORTED)
target_include_directories(meshtron::hdf5 INTERFACE ${HDF5_INCLUDE_DIRS})
target_link_libraries(meshtron::hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(meshtron::hdf5 INTERFACE ${HDF5_DEFINITIONS})

# --- Boost.Program_options ---------------------------------------------------
if(POLICY CMP0167)
  cmake_policy(SET CMP0167 NEW)
endif()
find_package(Boost 1.74 COMPONENTS program_options)
meshtron_require(Boost_FOUND "Boost.Program_options" "libboost-program-options-dev")

# --- Kokkos ------------------------------------------------------------------
find_package(Kokkos 3.4 QUIET)
meshtron_require(Kokkos_FOUND "Kokkos >= 3.4 (set Kokkos_ROOT)" "libtrilinos-kokkos-dev")
# Debian's Trilinos package records <prefix>/lib/include, which does not exist;
# its headers are in <prefix>/include/trilinos. Correct only a missing path.
get_target_property(_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
set(_kokkos_fixed "")
foreach(_dir IN LISTS _kokkos_inc)
  if(EXISTS "${_dir}/Kokkos_Core.hpp")
    list(APPEND _kokkos_fixed "${_dir}")
  endif()
endforeach()
if(NOT _kokkos_fixed)
  find_path(KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
            PATHS /usr/include/trilinos PATH_SUFFIXES trilinos)
  meshtron_require(KOKKOS_INCLUDE_DIR "Kokkos headers" "libtrilinos-kokkos-dev")
  set_target_properties(Kokkos::kokkos PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${KOKKOS_INCLUDE_DIR}")
  message(STATUS "Kokkos: corrected include path to ${KOKKOS_INCLUDE_DIR}")
endif()

# --- OpenBLAS (CBLAS) --------------------------------------------------------
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
find_library(CBLAS_LIBRARY NAMES openblas)
meshtron_require(CBLAS_LIBRARY "OpenBLAS (CBLAS)" "libopenblas-dev")
add_library(meshtron::cblas INTERFACE IMPORTED)
target_include_directories(meshtron::cblas INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(meshtron::cblas INTERFACE ${CBLAS_LIBRARY})

# --- nlohmann-json, PCRE2 ----------------------------------------------------
find_package(nlohmann_json 3.9 QUIET)
meshtron_require(nlohmann_json_FOUND "nlohmann-json" "nlohmann-json3-dev")
find_path(PCRE2_INCLUDE_DIR pcre2.h)
find_library(PCRE2_LIBRARY NAMES pcre2-8)
meshtron_require(PCRE2_LIBRARY "PCRE2" "libpcre2-dev")
add_library(meshtron::pcre2 INTERFACE IMPORTED)
target_include_directories(meshtron::pcre2 INTERFACE ${PCRE2_INCLUDE_DIR})
target_link_libraries(meshtron::pcre2 INTERFACE ${PCRE2_LIBRARY})
target_compile_definitions(meshtron::pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)

# --- SentencePiece (data.tokenizer = sentencepiece) ------------------------
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(SENTENCEPIECE QUIET IMPORTED_TARGET sentencepiece)
endif()
# Without pkg-config (a GPU node with the packages unpacked into a private
# prefix, docs/gpu-node.md): the header and library on CMAKE_PREFIX_PATH.
if(NOT SENTENCEPIECE_FOUND)
  find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h)
  find_library(SENTENCEPIECE_LIBRARY sentencepiece)
  if(SENTENCEPIECE_INCLUDE_DIR AND SENTENCEPIECE_LIBRARY)
    add_library(PkgConfig::SENTENCEPIECE INTERFACE IMPORTED)
    set_target_properties(PkgConfig::SENTENCEPIECE PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${SENTENCEPIECE_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${SENTENCEPIECE_LIBRARY}")
    set(SENTENCEPIECE_FOUND TRUE)
  endif()
endif()
meshtron_require(SENTENCEPIECE_FOUND "SentencePiece (found by pkg-config)"
                 "libsentencepiece-dev pkg-config")

# --- cpp-httplib (meshtron serve) -------------------------------------------
# Debian builds it split: httplib.h declares, libcpp-httplib.so defines.
find_path(HTTPLIB_INCLUDE_DIR httplib.h)
find_library(HTTPLIB_LIBRARY NAMES cpp-httplib)
meshtron_require(HTTPLIB_INCLUDE_DIR "cpp-httplib (httplib.h)" "libcpp-httplib-dev")
meshtron_require(HTTPLIB_LIBRARY "cpp-httplib (libcpp-httplib.so)" "libcpp-httplib-dev")
find_package(Threads REQUIRED)
add_library(meshtron::httplib INTERFACE IMPORTED)
target_include_directories(meshtron::httplib INTERFACE ${HTTPLIB_INCLUDE_DIR})
target_link_libraries(meshtron::httplib INTERFACE ${HTTPLIB_LIBRARY} Threads::Threads)

# --- utf8proc (the Unicode tables of the BERT WordPiece tokenizer) ----------
if(PKG_CONFIG_FOUND)
  pkg_check_modules(UTF8PROC QUIET IMPORTED_TARGET libutf8proc)
endif()
if(UTF8PROC_FOUND)
  add_library(meshtron::utf8proc ALIAS PkgConfig::UTF8PROC)
else()
  # Without pkg-config: the header and library on CMAKE_PREFIX_PATH.
  find_path(UTF8PROC_INCLUDE_DIR utf8proc.h)
  find_library(UTF8PROC_LIBRARY utf8proc)
  if(UTF8PROC_INCLUDE_DIR AND UTF8PROC_LIBRARY)
    add_library(meshtron::utf8proc INTERFACE IMPORTED)
    set_target_properties(meshtron::utf8proc PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${UTF8PROC_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${UTF8PROC_LIBRARY}")
    set(UTF8PROC_FOUND TRUE)
  endif()
endif()
meshtron_require(UTF8PROC_FOUND "utf8proc" "libutf8proc-dev")

# --- GoogleTest, Google Benchmark -------------------------------------------
if(MESHTRON_BUILD_TESTS)
  find_package(GTest)
  meshtron_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")
endif()
if(MESHTRON_BUILD_PERF)
  find_package(benchmark)
  meshtron_require(benchmark_FOUND "Google Benchmark" "libbenchmark-dev")
endif()

# --- CUDA, cuBLASLt, NCCL (optional) ----------------------------------------
set(MESHTRON_HAVE_CUDA OFF)
if(NOT MESHTRON_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS "/usr/local/cuda/bin/nvcc")
    set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    find_package(CUDAToolkit REQUIRED)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
      add_library(meshtron::nccl INTERFACE IMPORTED)
      target_include_directories(meshtron::nccl INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(meshtron::nccl INTERFACE ${NCCL_LIBRARY})
      set(MESHTRON_HAVE_CUDA ON)
    elseif(MESHTRON_CUDA STREQUAL "ON")
      message(FATAL_ERROR "MESHTRON_CUDA=ON but NCCL was not found "
        "(libnccl-dev, or NCCL under /usr/local/cuda)")
    endif()
  elseif(MESHTRON_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MESHTRON_CUDA=ON but no CUDA compiler was found "
      "(install the CUDA toolkit at /usr/local/cuda)")
  endif()
endif()
message(STATUS "meshtron: CUDA path ${MESHTRON_HAVE_CUDA}")
