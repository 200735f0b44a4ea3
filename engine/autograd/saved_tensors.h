// SavedTensors: what forward keeps for backward, for one (microbatch, model chunk), like one
// autograd graph. Several can be alive at once under a pipeline schedule.
//
// - Save(key, t) keeps t until backward's Load(key), which hands it back and forgets it, so
//   memory is released as backward proceeds. Keys are module-scoped names
//   ("layers.3.attention.q"); saving a key twice is a bug.
// - In a forward-only pass (training() == false, e.g. evaluation) Save does nothing.
// - Groups: a module opens a named group (an offload unit, named by the module) for a
//   layer at its input; every Save until the group is closed belongs to it (one group is open at
//   a time; saves outside any group are never offloaded). The group is committed at its defined
//   point, which may come later than its close: a norm's group commits after the residual add.
//   The offload manager observes commits and loads through SavedTensorHooks; with no hooks the
//   tensors stay in place.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace moe {

struct SavedGroup {
  std::string name;               // module group name (modules/offload_groups.h)
  int layer = -1;                 // layer index in the model
  std::vector<std::string> keys;  // saved while the group was open, in order
  bool committed = false;
};

class SavedTensors;

class SavedTensorHooks {
 public:
  virtual ~SavedTensorHooks() = default;
  // A group was committed: its tensors are in `saved` under group.keys.
  virtual void OnCommit(SavedTensors& saved, const SavedGroup& group) = 0;
  // Backward is about to read `key`, which belongs to `group` (nullptr if none).
  virtual void BeforeLoad(SavedTensors& saved, const SavedGroup* group, const std::string& key) = 0;
  // `saved` is being destroyed (its backward is over, or it was abandoned).
  virtual void OnDestroy(SavedTensors& /*saved*/) {}
};

class SavedTensors {
 public:
  explicit SavedTensors(bool training = true, SavedTensorHooks* hooks = nullptr)
      : training_(training), hooks_(hooks) {}
  ~SavedTensors();
  SavedTensors(const SavedTensors&) = delete;
  SavedTensors& operator=(const SavedTensors&) = delete;

  bool training() const { return training_; }

  void Save(const std::string& key, const Tensor& t);
  Tensor Load(const std::string& key);
  // Replaces a saved tensor in place (the offload manager swapping device and host copies).
  void Replace(const std::string& key, const Tensor& t);
  const Tensor& Peek(const std::string& key) const;
  // Recompute: forgets every saved entry that holds `t` (the same view of the same storage) and
  // returns their keys, for the module that produced `t` to Save them again in backward once it
  // has recomputed it. Nothing in a forward-only pass.
  std::vector<std::string> Drop(const Tensor& t);

  // Returns the group's id. Groups are ignored (id 0, nothing recorded) in forward-only passes.
  size_t OpenGroup(const std::string& name, int layer);
  void CloseGroup(size_t id);
  void CommitGroup(size_t id);  // closes it first if still open
  const std::vector<SavedGroup>& groups() const { return groups_; }

  bool empty() const { return tensors_.empty(); }
  size_t size() const { return tensors_.size(); }
  std::vector<std::string> keys() const;

 private:
  bool training_;
  SavedTensorHooks* hooks_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, size_t> group_of_key_;  // key -> index into groups_
  std::vector<SavedGroup> groups_;
  std::optional<size_t> open_group_;
};

// Opens a group for a scope and commits it when the scope ends.
class ScopedSaveGroup {
 public:
  ScopedSaveGroup(SavedTensors& saved, const std::string& name, int layer)
      : saved_(saved), id_(saved.OpenGroup(name, layer)) {}
  ~ScopedSaveGroup() { saved_.CommitGroup(id_); }
  ScopedSaveGroup(const ScopedSaveGroup&) = delete;
  ScopedSaveGroup& operator=(const ScopedSaveGroup&) = delete;

 private:
  SavedTensors& saved_;
  size_t id_;
};

}  // namespace moe
