// The session a message is about, on either side of the stream: what routing (the agent's
// mailboxes) and ordering (both sides' outgoing queues keep each session's messages in
// order) key on. nullopt for messages of the whole stream (Hello, Control, DeviceState).
#pragma once

#include <cstdint>
#include <optional>

#include "tophat/v1/cloud.pb.h"

namespace tophat {

inline std::optional<uint64_t> SessionOf(const v1::CloudMessage& message) {
  switch (message.kind_case()) {
    case v1::CloudMessage::kAdmitted:
      return message.admitted().session_id();
    case v1::CloudMessage::kResult:
      return message.result().session_id();
    case v1::CloudMessage::kTruncated:
      return message.truncated().session_id();
    case v1::CloudMessage::kError:
      return message.error().session_id();
    case v1::CloudMessage::kReceived:
      return message.received().session_id();
    default:
      return std::nullopt;
  }
}

inline std::optional<uint64_t> SessionOf(const v1::AgentMessage& message) {
  switch (message.kind_case()) {
    case v1::AgentMessage::kOpen:
      return message.open().session_id();
    case v1::AgentMessage::kForward:
      return message.forward().session_id();
    case v1::AgentMessage::kTruncate:
      return message.truncate().session_id();
    case v1::AgentMessage::kCancel:
      return message.cancel().session_id();
    case v1::AgentMessage::kClose:
      return message.close().session_id();
    case v1::AgentMessage::kPark:
      return message.park().session_id();
    case v1::AgentMessage::kResume:
      return message.resume().session_id();
    case v1::AgentMessage::kFork:
      return message.fork().new_session_id();  // the session it makes, and answers name
    default:
      return std::nullopt;
  }
}

}  // namespace tophat
