// Which replicas hold a parameter's values, under expert parallelism (Megatron-LM's
// --expert_model_parallel_size E): the D data-parallel ranks of a pipeline stage form groups of E
// consecutive ranks (expert-parallel groups), each rank holding 1/E of every MoE layer's experts.
//   kData        every rank of the data group holds the parameter (dense parameters: attention,
//                norms, router, embedding, head);
//   kExpertData  only the expert-data group does: the D / E ranks at the same position in their
//                expert-parallel groups (the experts a rank holds).
// Gradients are reduced, and a distributed optimizer's state sharded, over the parameter's group.
// ByReplicaGroup holds one value per group (a communicator, a sharding).
#pragma once

namespace moe {

enum class ReplicaGroup { kData, kExpertData };

inline constexpr ReplicaGroup kReplicaGroups[] = {ReplicaGroup::kData, ReplicaGroup::kExpertData};

// "data" or "expert-data".
inline const char* ReplicaGroupName(ReplicaGroup group) {
  return group == ReplicaGroup::kData ? "data" : "expert-data";
}

template <typename T>
struct ByReplicaGroup {
  T data{};         // ReplicaGroup::kData's
  T expert_data{};  // ReplicaGroup::kExpertData's

  T& operator[](ReplicaGroup group) { return group == ReplicaGroup::kData ? data : expert_data; }
  const T& operator[](ReplicaGroup group) const {
    return group == ReplicaGroup::kData ? data : expert_data;
  }
};

}  // namespace moe
