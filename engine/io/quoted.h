// How the io messages name a path or a name: in single quotes ('ckpt/step_00000100').
#pragma once

#include <string>

namespace moe {

inline std::string Quoted(const std::string& text) { return "'" + text + "'"; }

}  // namespace moe
