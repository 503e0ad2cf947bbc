"""Kept responses and conversations across an agent's restart (openai.store_dir), through the
official OpenAI client against a real tophat-agent.

  openai_restart_test.py keep BASE_URL STATE_FILE
      before the restart: two turns through previous_response_id, a conversation with a
      turn, a response deleted; what the check needs is written to STATE_FILE.
  openai_restart_test.py check BASE_URL STATE_FILE AGENT_METRICS_URL CANCELLED_ID [FAILED_ID]
      after it: the same response, input items and conversation come back; a second turn
      from the kept first turn reads the same prompt (its input tokens) and gives the same
      greedy answer, computed afresh (no cached tokens: a new process); the conversation
      goes on; the deleted response stays deleted; CANCELLED_ID (running when the agent was
      stopped) is "cancelled"; FAILED_ID (running when the agent was killed) is "failed".
"""

import json
import sys

import openai

# The client test's checks (tests/openai_client_test.py, beside this file).
from openai_client_test import Mismatch, check, metric, report

TURN = dict(max_output_tokens=8, temperature=0)


def item_ids(page):
    return [item.id for item in page.data]


def keep(client, state_file):
    model = client.models.list().data[0].id
    first = client.responses.create(model=model, input="the old farmer", **TURN)
    second = client.responses.create(model=model, previous_response_id=first.id,
                                     input="and the dog", **TURN)
    check(second.usage.input_tokens_details.cached_tokens > 0,
          "the second turn before the restart reused the first's positions")
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "the old farmer"}],
        metadata={"topic": "farms"})
    client.responses.create(model=model, conversation=conversation.id, input="and the dog",
                            **TURN)
    deleted = client.responses.create(model=model, input="the young farmer", **TURN)
    client.responses.delete(deleted.id)
    state = {
        "model": model,
        "first": first.model_dump(),
        "second": {"text": second.output_text, "input_tokens": second.usage.input_tokens,
                   "input_items": item_ids(client.responses.input_items.list(second.id))},
        "conversation": {"id": conversation.id, "items": [
            item.model_dump() for item in
            client.conversations.items.list(conversation.id, order="asc").data]},
        "deleted": deleted.id,
    }
    with open(state_file, "w") as out:
        json.dump(state, out)
    print(f"kept: {first.id} and {second.id}, {conversation.id} with "
          f"{len(state['conversation']['items'])} items")


def after_restart(client, state_file, agent_metrics_url, cancelled_id, failed_id=""):
    with open(state_file) as f:
        state = json.load(f)
    model = state["model"]
    check(metric(agent_metrics_url, "tophat_openai_stored_responses") >= 3,
          "the kept responses are counted after the restart")
    check(metric(agent_metrics_url, "tophat_openai_conversations") >= 1,
          "the kept conversation is counted after the restart")
    check(metric(agent_metrics_url, "tophat_openai_store_file_errors_total") == 0,
          "no kept file failed")
    first = client.responses.retrieve(state["first"]["id"])
    for field in ("id", "status", "output", "usage", "created_at"):
        check(first.model_dump()[field] == state["first"][field],
              f"the kept first turn's {field} after the restart: "
              f"{first.model_dump()[field]} against {state['first'][field]}")
    second = client.responses.create(model=model, previous_response_id=first.id,
                                     input="and the dog", **TURN)
    check(second.usage.input_tokens == state["second"]["input_tokens"],
          f"the second turn after the restart reads {second.usage.input_tokens} tokens, "
          f"before it {state['second']['input_tokens']}")
    check(second.usage.input_tokens_details.cached_tokens == 0,
          "the second turn after the restart is computed by a new process")
    check(second.output_text == state["second"]["text"],
          f"the second turn after the restart: {second.output_text!r} against "
          f"{state['second']['text']!r}")
    check(len(item_ids(client.responses.input_items.list(second.id))) ==
          len(state["second"]["input_items"]),
          "the second turn's input items after the restart")

    conversation_id = state["conversation"]["id"]
    conversation = client.conversations.retrieve(conversation_id)
    check(conversation.metadata == {"topic": "farms"},
          f"the conversation's metadata after the restart: {conversation.metadata}")
    items = [item.model_dump() for item in
             client.conversations.items.list(conversation_id, order="asc").data]
    check(items == state["conversation"]["items"],
          f"the conversation's items after the restart: {items}")
    client.responses.create(model=model, conversation=conversation_id, input="and then",
                            **TURN)
    grown = client.conversations.items.list(conversation_id, order="asc").data
    check(len(grown) == len(items) + 2,
          f"a turn after the restart adds its input and answer: {len(grown)} items")

    try:
        client.responses.retrieve(state["deleted"])
        raise Mismatch("a response deleted before the restart came back")
    except openai.NotFoundError:
        pass
    cancelled = client.responses.retrieve(cancelled_id)
    check(cancelled.status == "cancelled",
          f"a background response running at the stop: {cancelled.status}")
    if failed_id:
        failed = client.responses.retrieve(failed_id)
        check(failed.status == "failed" and failed.error is not None and
              "stopped before this response finished" in failed.error.message,
              f"a background response running when the agent was killed: {failed.status} "
              f"{failed.error}")
    print(f"after the restart: {first.id} as kept, a second turn of "
          f"{second.usage.input_tokens} tokens computed afresh with the same answer, "
          f"{conversation_id} with {len(items)} items and one more turn, the deleted one "
          f"gone, the stopped one cancelled" + (", the killed one failed" if failed_id else ""))


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("keep", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    client = openai.OpenAI(base_url=sys.argv[2], api_key="unused", max_retries=0, timeout=120)
    if sys.argv[1] == "keep":
        return report(lambda: keep(client, sys.argv[3]))
    return report(lambda: after_restart(client, *sys.argv[3:7]))


if __name__ == "__main__":
    sys.exit(main())
