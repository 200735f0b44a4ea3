#include "engine/dist/process_groups.h"

#include <glog/logging.h>

namespace moe {

ProcessGroups SplitProcessGroups(Communicator& world, int pipeline_size, Stream& stream) {
  CHECK(pipeline_size >= 1 && world.size() % pipeline_size == 0)
      << "pipeline size " << pipeline_size << " does not divide " << world.size() << " ranks";
  const int data_size = world.size() / pipeline_size;
  const int pipeline_rank = world.rank() / data_size;
  const int data_rank = world.rank() % data_size;
  ProcessGroups groups;
  groups.pipeline = world.Split(/*color=*/data_rank, /*key=*/pipeline_rank, stream);
  groups.data = world.Split(/*color=*/pipeline_rank, /*key=*/data_rank, stream);
  return groups;
}

}  // namespace moe
