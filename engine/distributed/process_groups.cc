#include "engine/distributed/process_groups.h"

#include <glog/logging.h>

#include "engine/runtime/device_context.h"

namespace moe {

ProcessGroups SplitProcessGroups(Communicator& world, int pipeline_size) {
  CHECK(pipeline_size >= 1 && world.size() % pipeline_size == 0)
      << "pipeline size " << pipeline_size << " does not divide " << world.size() << " ranks";
  const int data_size = world.size() / pipeline_size;
  const int pipeline_rank = world.rank() / data_size;
  const int data_rank = world.rank() % data_size;
  DeviceContext& context = DeviceContext::Get(world.device());
  ProcessGroups groups;
  groups.pipeline_stream = context.CreateSideStream();
  groups.data_stream = context.CreateSideStream();
  groups.pipeline =
      world.Split(/*color=*/data_rank, /*key=*/pipeline_rank, *groups.pipeline_stream);
  groups.data = world.Split(/*color=*/pipeline_rank, /*key=*/data_rank, *groups.data_stream);
  return groups;
}

}  // namespace moe
