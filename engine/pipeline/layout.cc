#include "engine/pipeline/layout.h"

#include <utility>

namespace moe {

StatusOr<PipelineLayout> PipelineLayout::Create(const PartitionOptions& options, int microbatches) {
  MOE_ASSIGN_OR_RETURN(LayerPartition partition, LayerPartition::Create(options));
  ScheduleSpec spec;
  spec.pipeline_size = options.pipeline_size;
  spec.virtual_chunks = options.virtual_chunks;
  spec.microbatches = microbatches;
  spec.kind = DefaultScheduleKind(spec.pipeline_size, spec.virtual_chunks);
  MOE_ASSIGN_OR_RETURN(std::vector<RankActions> schedule, BuildSchedule(spec));
  return PipelineLayout{std::move(partition), std::move(schedule)};
}

}  // namespace moe
