// The checks of tests/scripts/serve_openai_client.sh, as a user's program makes them with the
// official `openai` npm client against a running serve task.
//   node serve_openai_client.mjs ADDRESS SAMPLE_JSON OPENAI_INDEX_MJS
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [address, samplePath, clientPath] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(clientPath).href);
const sample = JSON.parse(readFileSync(samplePath, 'utf8'));
// No retries: a 4xx or 5xx must reach the checks, not be retried away. No time limit of the
// client's own either: the server answers from training's bubbles, and on a loaded machine a
// step (and so a request) can take longer than any fixed figure (120 s once failed the test).
// The deadline follows the server's progress instead: the test gives up when the server's
// state (queue, tokens, bubble rate) has not moved for STALL_MS, polled once a second.
const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: 'unused', maxRetries: 0,
                            timeout: 2_000_000_000 });
const step = (what) => console.log(`ok: ${what}`);
const STALL_MS = 180_000;
let lastState = '', lastMove = Date.now(), polling = false;
const watchdog = setInterval(async () => {
  if (polling) return;
  polling = true;
  try {
    const state = await (await fetch(`${address}/metrics?format=json`)).text();
    if (state !== lastState) lastState = state, lastMove = Date.now();
  } catch (e) {
    // A refused poll is no progress; the request's own error says what happened.
  } finally {
    polling = false;
  }
  if (Date.now() - lastMove > STALL_MS) {
    console.error(`FAIL: the server made no progress for ${STALL_MS / 1000} s: ${lastState}`);
    process.exit(1);
  }
}, 1000);
watchdog.unref();

// The served model: the checkpoint's directory.
const models = await client.models.list();
assert.equal(models.data.length, 1);
const model = models.data[0].id;
assert.equal(model, 'step_00000004');
assert.equal((await client.models.retrieve(model)).id, model);
step(`models: ${model}`);

// Plain: equal to `freeride sample` for the same checkpoint, prompt and seed.
const ask = { model, prompt: 'In the beginning', max_tokens: 12, seed: 3, temperature: 0.9,
              top_k: 30 };
const plain = await client.completions.create(ask);
assert.equal(plain.object, 'text_completion');
assert.match(plain.id, /^cmpl-/);
assert.equal(plain.model, model);
assert.ok(Number.isInteger(plain.created));
assert.equal(plain.choices.length, 1);
assert.equal(plain.choices[0].index, 0);
// The same tokens; the same text where it is whole UTF-8 (a model trained a few steps may end
// a piece inside a character, which each side replaces in its own way).
assert.deepEqual(plain.choices[0].tokens, sample.tokens);
if (!sample.text.includes('\ufffd')) assert.equal(plain.choices[0].text, sample.text);
assert.equal(plain.choices[0].finish_reason, 'length');
assert.deepEqual(plain.usage, { prompt_tokens: 3, completion_tokens: 12, total_tokens: 15 });
step(`plain: ${JSON.stringify(plain.choices[0].text)}`);

// Streamed: the same text, in more than one event, the last one saying why it ended; with
// stream_options.include_usage a last chunk carries the usage.
const stream = await client.completions.create({ ...ask, stream: true,
                                                 stream_options: { include_usage: true } });
let streamed = '', events = 0, finish = null, usage = null;
for await (const chunk of stream) {
  events += 1;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    assert.equal(c.index, 0);
    streamed += c.text;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.equal(streamed, plain.choices[0].text);
assert.ok(events > 2, `${events} events`);
assert.equal(finish, 'length');
assert.deepEqual(usage, plain.usage);
step(`streamed in ${events} events`);

// Stop: the text ends before the stop sequence, finish_reason "stop"; streamed alike.
// Two ASCII letters from the text, nearest its middle.
const text = plain.choices[0].text;
const middle = Math.floor(text.length / 2);
const at = Array.from({ length: text.length }, (_, i) => i).sort((x, y) => Math.abs(x - middle) - Math.abs(y - middle))
  .find((i) => i > 0 && /^[A-Za-z]{2}$/.test(text.slice(i, i + 2)));
assert.ok(at !== undefined, `no two ASCII letters in ${JSON.stringify(text)}`);
const stop = text.slice(at, at + 2);
const expected = text.slice(0, text.indexOf(stop));
const stopped = await client.completions.create({ ...ask, stop: [stop, 'never seen \u00a7'] });
assert.equal(stopped.choices[0].text, expected);
assert.equal(stopped.choices[0].finish_reason, 'stop');
let stoppedStream = '', stoppedFinish = null;
for await (const chunk of await client.completions.create({ ...ask, stop, stream: true })) {
  stoppedStream += chunk.choices[0].text;
  stoppedFinish = chunk.choices[0].finish_reason ?? stoppedFinish;
}
assert.equal(stoppedStream, expected);
assert.equal(stoppedFinish, 'stop');
step(`stop ${JSON.stringify(stop)}: ${JSON.stringify(expected)}`);

// A list of prompts: one choice each, in order; n: n choices of one prompt.
const batch = await client.completions.create({ ...ask, prompt: ['In the beginning', 'And God said'] });
assert.deepEqual(batch.choices.map((c) => c.index), [0, 1]);
assert.deepEqual(batch.choices[0].tokens, sample.tokens);
assert.equal(batch.usage.prompt_tokens, 3 + 3);
assert.equal(batch.usage.completion_tokens, 24);
const two = await client.completions.create({ ...ask, n: 2 });
assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
assert.deepEqual(two.choices[0].tokens, sample.tokens);
assert.notDeepEqual(two.choices[1].tokens, sample.tokens);  // drawn with seed + 1
step('batch of 2 prompts, n = 2');

// Chat: the documented template; the reply as the assistant's message, streamed alike.
const messages = [{ role: 'system', content: 'You answer from the scriptures.' },
                  { role: 'user', content: 'Who made the light?' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, seed: 2 });
assert.equal(chat.object, 'chat.completion');
assert.match(chat.id, /^chatcmpl-/);
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(typeof chat.choices[0].message.content, 'string');
assert.ok(!chat.choices[0].message.content.includes('\nUser:'));
assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
let reply = '', role = null;
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 16,
                                                                 seed: 2, stream: true })) {
  assert.equal(chunk.object, 'chat.completion.chunk');
  role = chunk.choices[0].delta.role ?? role;
  reply += chunk.choices[0].delta.content ?? '';
}
assert.equal(role, 'assistant');
assert.equal(reply, chat.choices[0].message.content);
step(`chat: ${JSON.stringify(reply)}`);

// Errors: the client's own classes, from OpenAI's error shape.
const refused = async (request, Class, status, param, code) => {
  await assert.rejects(request, (e) => {
    assert.ok(e instanceof Class, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    if (param !== undefined) assert.equal(e.param, param);
    if (code !== undefined) assert.equal(e.code, code);
    return true;
  });
};
await refused(client.completions.create({ ...ask, max_tokens: 100000 }), OpenAI.BadRequestError,
              400, 'max_tokens');
await refused(client.completions.create({ ...ask, echo: true }), OpenAI.BadRequestError, 400,
              'echo', 'unsupported_parameter');
await refused(client.completions.create({ ...ask, model: 'gpt-4' }), OpenAI.NotFoundError, 404,
              'model', 'model_not_found');
await refused(client.chat.completions.create({ model, messages: [{ role: 'tool', content: 'x' }] }),
              OpenAI.BadRequestError, 400, 'messages[0].role');
const unknown = await fetch(`${address}/v1/nothing`);
assert.equal(unknown.status, 404);
assert.equal((await unknown.json()).error.code, 'unknown_url');
step('errors: 400, 404 as BadRequestError, NotFoundError');

// No padding in a body: the JSON starts at once.
const raw = await fetch(`${address}/v1/completions`, {
  method: 'POST', headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ ...ask, max_tokens: 2 }) });
assert.equal((await raw.text())[0], '{');

// /metrics: Prometheus text, with what was served above. An answer is counted once written,
// so the last ones may be counted just after their client read them: polled for up to 60 s.
const wanted = [/^freeride_serve_requests_total\{route="\/v1\/completions",status="200"\} \d+$/m,
                /^freeride_serve_requests_total\{route="\/v1\/completions",status="400"\} 2$/m,
                /^freeride_serve_requests_total\{route="\/v1\/completions",status="404"\} 1$/m,
                /^freeride_serve_requests_total\{route="\/v1\/chat\/completions",status="200"\} 2$/m,
                /^freeride_serve_requests_total\{route="other",status="404"\} 1$/m,
                /^freeride_serve_time_to_first_token_seconds_count \d+$/m,
                /^freeride_serve_request_duration_seconds_bucket\{le="\+Inf"\} \d+$/m,
                /^freeride_serve_slots 4$/m];
let exposition = '';
for (const giveUp = Date.now() + 60_000; ;) {
  const metrics = await fetch(`${address}/metrics`);
  assert.equal(metrics.headers.get('content-type').split(';').slice(0, 2).join(';'),
               'text/plain; version=0.0.4');
  exposition = await metrics.text();
  if (wanted.every((line) => line.test(exposition)) || Date.now() > giveUp) break;
  await new Promise((resolve) => setTimeout(resolve, 100));
}
for (const line of wanted) assert.match(exposition, line);
assert.equal((await (await fetch(`${address}/metrics?format=json`)).json()).queue, 0);
step('metrics');
clearInterval(watchdog);
