#include "engine/autograd/saved_tensors.h"

#include <glog/logging.h>

namespace moe {

SavedTensors::~SavedTensors() {
  if (hooks_ && training_) hooks_->OnDestroy(*this);
}

void SavedTensors::Save(const std::string& key, const Tensor& t) {
  if (!training_) return;
  CHECK(t.defined()) << "saving an undefined tensor as " << key;
  CHECK(tensors_.emplace(key, t).second) << "tensor saved twice: " << key;
  if (open_group_) {
    group_of_key_[key] = *open_group_;
    groups_[*open_group_].keys.push_back(key);
  }
}

Tensor SavedTensors::Load(const std::string& key) {
  CHECK(training_) << "Load in a forward-only pass: " << key;
  auto it = tensors_.find(key);
  CHECK(it != tensors_.end()) << "no saved tensor " << key;
  if (hooks_) {
    auto group = group_of_key_.find(key);
    hooks_->BeforeLoad(*this, group == group_of_key_.end() ? nullptr : &groups_[group->second],
                       key);
    it = tensors_.find(key);
  }
  Tensor t = std::move(it->second);
  tensors_.erase(it);
  return t;
}

void SavedTensors::Replace(const std::string& key, const Tensor& t) {
  auto it = tensors_.find(key);
  CHECK(it != tensors_.end()) << "no saved tensor " << key;
  it->second = t;
}

std::vector<std::string> SavedTensors::Drop(const Tensor& t) {
  std::vector<std::string> keys;
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    const Tensor& saved = it->second;
    if (saved.data() == t.data() && saved.shape() == t.shape() && saved.dtype() == t.dtype()) {
      keys.push_back(it->first);
      it = tensors_.erase(it);
    } else {
      ++it;
    }
  }
  return keys;
}

const Tensor& SavedTensors::Peek(const std::string& key) const {
  auto it = tensors_.find(key);
  CHECK(it != tensors_.end()) << "no saved tensor " << key;
  return it->second;
}

size_t SavedTensors::OpenGroup(const std::string& name, int layer) {
  if (!training_) return 0;
  CHECK(!open_group_) << "group " << name << " opened while " << groups_[*open_group_].name
                      << " is open";
  groups_.push_back({name, layer, {}, false});
  open_group_ = groups_.size() - 1;
  return *open_group_;
}

void SavedTensors::CloseGroup(size_t id) {
  if (!training_) return;
  CHECK(open_group_ == id) << "closing group " << groups_.at(id).name << " that is not open";
  open_group_.reset();
}

void SavedTensors::CommitGroup(size_t id) {
  if (!training_) return;
  SavedGroup& group = groups_.at(id);
  CHECK(!group.committed) << "group " << group.name << " committed twice";
  if (open_group_ == id) open_group_.reset();
  group.committed = true;
  if (hooks_) hooks_->OnCommit(*this, group);
}

std::vector<std::string> SavedTensors::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, t] : tensors_) out.push_back(key);
  return out;
}

}  // namespace moe
