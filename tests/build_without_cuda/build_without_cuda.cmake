# cmake -DSOURCE_DIR=... -DBINARY_DIR=... -DGENERATOR=... -P build_without_cuda.cmake
# Configures SOURCE_DIR without the CUDA path (and without tests) into
# BINARY_DIR and builds the meshtron executable; fails with the first errors.
cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
foreach(step configure build)
  if(step STREQUAL "configure")
    set(cmd ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR}
            -DCMAKE_BUILD_TYPE=Release -DMESHTRON_CUDA=OFF
            -DMESHTRON_TEST_FOLDERS=build_without_cuda)
  else()
    set(cmd ${CMAKE_COMMAND} --build ${BINARY_DIR} --target meshtron -j ${cores})
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REGEX MATCHALL "[^\n]*(error|Error)[^\n]*" errors "${out}")
    list(SUBLIST errors 0 10 errors)
    list(JOIN errors "\n" errors)
    message(FATAL_ERROR "build_without_cuda: ${step} failed (rc ${rc}):\n${errors}")
  endif()
endforeach()
message(STATUS "build_without_cuda: meshtron built without the CUDA path in ${BINARY_DIR}")
