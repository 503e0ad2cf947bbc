// The official OpenAI client library (npm `openai`) against tophat-agent's endpoint.
// Usage: node openai_client_test.mjs BASE_URL CLOUD_METRICS_URL AGENT_METRICS_URL
// Exits non-zero, saying what differed, on the first failure.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, cloudMetricsUrl, agentMetricsUrl] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });

// One series' value from a Prometheus endpoint: `series` is the name with its labels as
// the text format writes them, e.g. 'x_total{reason="a"}'.
async function metric(url, series) {
  const text = await (await fetch(url)).text();
  const line = text.split("\n").find((l) => l.startsWith(series + " "));
  assert.ok(line, `${series} not in ${url}`);
  return Number(line.trim().split(/\s+/).pop());
}

async function waitFor(what, condition, seconds) {
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    if (await condition()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out after ${seconds} s waiting for ${what}`);
}

const models = await client.models.list();
assert.equal(models.data.length, 1);
const model = models.data[0].id;
const messages = [
  { role: "system", content: "tell a story" },
  { role: "user", content: "the old farmer saw a little bird" },
];

// Non-streaming, greedy: the same request twice gives the same answer, and usage counts it.
const first = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
const text = first.choices[0].message.content;
assert.equal(first.object, "chat.completion");
assert.equal(first.choices[0].message.role, "assistant");
assert.ok(text.split(" ").length >= 8, `a short answer: ${JSON.stringify(text)}`);
assert.equal(first.choices[0].finish_reason, "length");
assert.equal(first.usage.completion_tokens, 24);
assert.ok(first.usage.prompt_tokens > 10);
assert.equal(first.usage.total_tokens, first.usage.prompt_tokens + 24);
assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
// Asked again, the agent reuses the first answer's positions on both sides (all of the prompt
// but its last token, which gives the first new one) and answers the same.
const again = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
assert.equal(again.choices[0].message.content, text);
assert.equal(again.usage.prompt_tokens_details.cached_tokens, first.usage.prompt_tokens - 1);
console.log(`chat: ${JSON.stringify(text)}`);

// The conversation's next turn: its history is reused, only the new message is computed.
const turn2 = [...messages, { role: "assistant", content: text }, { role: "user", content: "and then?" }];
const second = await client.chat.completions.create({ model, messages: turn2, max_tokens: 16, temperature: 0 });
assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens,
  `cached ${second.usage.prompt_tokens_details.cached_tokens} of ${second.usage.prompt_tokens}`);
console.log(`turn 2: ${second.usage.prompt_tokens_details.cached_tokens} of ${second.usage.prompt_tokens} prompt tokens reused`);

// Streaming: the deltas add up to the same text; usage comes last when asked for.
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 24, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let streamed = "";
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks += 1;
  assert.equal(chunk.object, "chat.completion.chunk");
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    streamed += choice.delta.content ?? "";
    finish = choice.finish_reason ?? finish;
  }
}
assert.equal(streamed, text);
assert.equal(finish, "length");
assert.ok(chunks > 3, `${chunks} chunks`);
assert.equal(usage.completion_tokens, 24);
console.log(`stream: ${chunks} chunks, same text`);

// A stop sequence: the answer ends before it, and the stop sequence is not in it.
const words = text.trim().split(" ");
const stopWord = words.find((w, i) => i >= 3 && w.length >= 3) ?? words[words.length - 1];
const stop = " " + stopWord;
const stopped = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stop: [stop] });
assert.equal(stopped.choices[0].finish_reason, "stop");
assert.equal(stopped.choices[0].message.content, text.slice(0, text.indexOf(stop)));
console.log(`stop ${JSON.stringify(stop)}: ${JSON.stringify(stopped.choices[0].message.content)}`);

// Completions, seeded sampling: the same seed gives the same text.
const sampled = [];
for (let i = 0; i < 2; i++) {
  const c = await client.completions.create({ model, prompt: "the brave knight", max_tokens: 16, temperature: 0.8, seed: 7 });
  assert.equal(c.object, "text_completion");
  sampled.push(c.choices[0].text);
}
assert.equal(sampled[0], sampled[1]);
assert.ok(sampled[0].length > 0);

// A bad request: OpenAI's error object, the right status, the field named.
await assert.rejects(
  client.chat.completions.create({ model, messages, n: 2 }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "n",
);
await assert.rejects(
  client.chat.completions.create({ model: "gpt-4o", messages }),
  (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found",
);
console.log("bad requests refused");

// A client that goes away mid-stream: the request is cancelled and the cloud frees its KV
// (the conversations kept from the requests above hold theirs: no more than that is left).
const keptKv = await metric(cloudMetricsUrl, "tophat_kv_cache_usage_ratio");
const cancelledBefore = await metric(agentMetricsUrl, 'tophat_request_success_total{finished_reason="cancelled"}');
const controller = new AbortController();
const long = await client.chat.completions.create(
  { model, messages: [{ role: "user", content: "a long story about a castle" }], max_tokens: 800, temperature: 0, stream: true },
  { signal: controller.signal },
);
let seen = 0;
try {
  for await (const chunk of long) {
    seen += 1;
    if (seen === 4) {
      assert.equal(await metric(cloudMetricsUrl, "tophat_num_sessions_running"), 1);
      controller.abort();
      // Chunks already read from the socket may still be handed out after the abort.
      break;
    }
  }
} catch (e) {
  assert.ok(e.name === "AbortError" || e instanceof OpenAI.APIUserAbortError, String(e));
}
assert.equal(seen, 4);
await waitFor("the agent to cancel the request",
  async () => (await metric(agentMetricsUrl, 'tophat_request_success_total{finished_reason="cancelled"}')) === cancelledBefore + 1, 20);
await waitFor("the cloud to free the session's KV",
  async () => (await metric(cloudMetricsUrl, "tophat_num_sessions_running")) === 0 &&
              (await metric(cloudMetricsUrl, "tophat_kv_cache_usage_ratio")) <= keptKv, 20);
console.log("a client gone mid-stream cancels its request; the cloud's KV is free");
console.log("PASS");
