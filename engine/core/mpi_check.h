// MOE_MPI_CALL: include only from translation units built with MPI.
#pragma once

#include <mpi.h>

#include "engine/core/check.h"

#define MOE_MPI_CALL(expr)                                                                \
  do {                                                                                    \
    int moe_err_ = (expr);                                                                \
    if (moe_err_ != MPI_SUCCESS) {                                                        \
      char moe_msg_[MPI_MAX_ERROR_STRING];                                                \
      int moe_len_ = 0;                                                                   \
      MPI_Error_string(moe_err_, moe_msg_, &moe_len_);                                    \
      ::moe::FailCall("MPI", #expr, __FILE__, __LINE__, std::string(moe_msg_, moe_len_)); \
    }                                                                                     \
  } while (0)
