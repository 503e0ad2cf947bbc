// The privacy guarantee, checked on the contract itself: nothing an agent sends to the cloud
// can carry token ids or text. Every message type reachable from CloudService's requests is
// walked by reflection; a new field that could smuggle tokens fails this test.
#include <set>
#include <string>

#include <google/protobuf/descriptor.h>

#include "tophat/v1/agent.pb.h"
#include "tophat/v1/cloud.grpc.pb.h"
#include "tophat/v1/cloud.pb.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// The fields allowed to hold opaque bytes: hidden states and int8's per-position scales,
// both validated for exact size (and the scales for finite, non-negative values).
const std::set<std::string> kAllowedBytes = {"tophat.v1.HiddenStates.data",
                                             "tophat.v1.HiddenStates.scales"};

void Walk(const Descriptor* message, std::set<std::string>& seen,
          std::vector<std::string>& violations) {
  if (!seen.insert(message->full_name()).second) return;
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* field = message->field(i);
    const std::string name = field->full_name();
    std::string lower = field->name();
    for (char& c : lower) c = static_cast<char>(std::tolower(c));
    for (const char* word : {"token", "text", "prompt", "vocab", "string"}) {
      if (lower.find(word) != std::string::npos) {
        violations.push_back(name + ": name suggests tokens or text");
      }
    }
    switch (field->type()) {
      case FieldDescriptor::TYPE_STRING:
        violations.push_back(name + ": string field");
        break;
      case FieldDescriptor::TYPE_BYTES:
        if (!kAllowedBytes.contains(name)) violations.push_back(name + ": bytes field");
        break;
      case FieldDescriptor::TYPE_MESSAGE:
      case FieldDescriptor::TYPE_GROUP:
        Walk(field->message_type(), seen, violations);
        break;
      default:
        // A list of integers could be a list of token ids.
        if (field->is_repeated()) violations.push_back(name + ": repeated scalar field");
        break;
    }
    if (field->is_map()) violations.push_back(name + ": map field");
  }
}

TEST_CASE("No message an agent sends to the cloud can carry token ids or text") {
  const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      "tophat.v1.CloudService");
  REQUIRE(service != nullptr);
  REQUIRE(service->method_count() > 0);
  std::set<std::string> seen;
  std::vector<std::string> violations;
  for (int i = 0; i < service->method_count(); ++i) {
    Walk(service->method(i)->input_type(), seen, violations);
  }
  INFO("checked " << seen.size() << " message types");
  // One message naming every violating field (an INFO inside a loop ends with its scope,
  // before the CHECK, and would report nothing).
  std::string named;
  for (const std::string& violation : violations) named += "\n  " + violation;
  INFO("fields that could carry ids or text:" << named);
  CHECK(violations.empty());
  // The walk really reached the payload.
  CHECK(seen.contains("tophat.v1.ForwardChunk"));
  CHECK(seen.contains("tophat.v1.HiddenStates"));
}

TEST_CASE("The privacy walk catches a field that could carry tokens") {
  // The app-facing request does carry text and ids: the same walk must flag it, or the
  // check above proves nothing.
  std::set<std::string> seen;
  std::vector<std::string> violations;
  Walk(v1::GenerateRequest::descriptor(), seen, violations);
  CHECK(violations.size() >= 2);  // prompt (string) and prompt_ids.ids (repeated integers)
}

}  // namespace
}  // namespace tophat
