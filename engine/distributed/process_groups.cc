#include "engine/distributed/process_groups.h"

#include <glog/logging.h>

#include "engine/runtime/device_context.h"

namespace moe {

ProcessGroups SplitProcessGroups(Communicator& world, int pipeline_size, int expert_size) {
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
  CHECK(expert_size >= 1 && data_size % expert_size == 0)
      << "expert-parallel size " << expert_size << " does not divide " << data_size
      << " data-parallel ranks";
  if (expert_size > 1) {
    groups.expert_stream = context.CreateSideStream();
    groups.expert_data_stream = context.CreateSideStream();
    groups.expert = groups.data->Split(/*color=*/data_rank / expert_size, /*key=*/data_rank,
                                       *groups.expert_stream);
    groups.expert_data = groups.data->Split(/*color=*/data_rank % expert_size, /*key=*/data_rank,
                                            *groups.expert_data_stream);
  }
  return groups;
}

}  // namespace moe
