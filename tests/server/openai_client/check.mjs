// OpenAI's official Node client, unmodified, against `rocmforge serve`: lists the model, completes and chats greedily,
// streamed and not, and gets the client's typed errors for refused requests. Exits 0 when every check holds, else 1
// with the first mismatch on stderr.
//
//   node check.mjs BASE_URL [EXPECTED_JSON]
//
// BASE_URL is the OpenAI API's root, e.g. http://127.0.0.1:8080/v1. OPENAI_API_KEY is the server's --api-key (any
// value when it has none); when set, a client with another key must be refused. EXPECTED_JSON, which the GoogleTest
// writes, names the requests ({"prompt", "message", "max_tokens"}) and their ground truth: "completion", `rocmforge
// run --temp 0`'s text, "chat", `rocmforge chat --temp 0`'s reply, and "prompt_tokens" and "chat_prompt_tokens",
// their prompts' token counts. Without it the greedy completion is compared with the native /generate route's,
// fetched without the client.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const [baseURL, expectedPath] = process.argv.slice(2);
if (!baseURL) {
  console.error('usage: node check.mjs BASE_URL [EXPECTED_JSON]');
  process.exit(2);
}
const expected = {
  prompt: 'Once upon a time',
  message: 'Tell me a story about a dog',
  max_tokens: 24,
  ...(expectedPath ? JSON.parse(readFileSync(expectedPath, 'utf8')) : {}),
};
const apiKey = process.env.OPENAI_API_KEY || 'unused';
// No retries: a failing request must show as the failure it is, not as a retry's.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });

class Mismatch extends Error {}

function expectEqual(actual, want, what) {
  if (actual !== want) throw new Mismatch(`${what}: got ${JSON.stringify(actual)}, expected ${JSON.stringify(want)}`);
}

function expectTrue(condition, what) {
  if (!condition) throw new Mismatch(what);
}

// Usage counts add up, and a choice cut at max_tokens has exactly that many tokens.
function checkUsage(usage, finishReason, what) {
  expectTrue(usage && usage.prompt_tokens > 0, `${what}: usage.prompt_tokens missing or 0: ${JSON.stringify(usage)}`);
  expectEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, `${what}: usage.total_tokens`);
  expectTrue(['length', 'stop'].includes(finishReason), `${what}: finish_reason ${JSON.stringify(finishReason)}`);
  if (finishReason === 'length') expectEqual(usage.completion_tokens, expected.max_tokens, `${what}: completion_tokens`);
  else expectTrue(usage.completion_tokens < expected.max_tokens, `${what}: stopped at ${usage.completion_tokens} tokens`);
}

// Reads a stream to its end: the concatenated text (`piece` of each chunk's first choice), the last finish_reason, the
// usage chunk (the last, without choices) and the chunks themselves.
async function readStream(stream, piece) {
  let text = '';
  let finishReason = null;
  let usage = null;
  const chunks = [];
  for await (const chunk of stream) {
    chunks.push(chunk);
    expectTrue(usage === null, 'a chunk came after the usage chunk');
    if (chunk.usage) {
      expectEqual(chunk.choices.length, 0, 'choices in the usage chunk');
      usage = chunk.usage;
    }
    for (const choice of chunk.choices) {
      text += piece(choice) ?? '';
      finishReason = choice.finish_reason ?? finishReason;
    }
  }
  expectTrue(usage !== null, 'no usage chunk although stream_options.include_usage was true');
  return { text, finishReason, usage, chunks };
}

// The typed error `request` must throw: its class, HTTP status and the OpenAI error object's fields.
async function expectError(request, errorClass, status, fields, what) {
  try {
    await request();
  } catch (error) {
    expectTrue(error instanceof errorClass, `${what}: threw ${error?.constructor?.name}, expected ${errorClass.name}`);
    expectEqual(error.status, status, `${what}: status`);
    for (const [field, value] of Object.entries(fields)) expectEqual(error[field], value, `${what}: error.${field}`);
    console.log(`ok   ${what}: ${errorClass.name} ${status}: ${error.message}`);
    return;
  }
  throw new Mismatch(`${what}: succeeded, expected ${errorClass.name}`);
}

async function main() {
  const models = await client.models.list();
  expectEqual(models.data.length, 1, 'models in /v1/models');
  const model = models.data[0].id;
  expectEqual(models.data[0].object, 'model', 'models.data[0].object');
  console.log(`ok   models.list: ${model}`);

  const completionRequest = { model, prompt: expected.prompt, max_tokens: expected.max_tokens, temperature: 0 };
  const completion = await client.completions.create(completionRequest);
  expectEqual(completion.object, 'text_completion', 'completion.object');
  expectEqual(completion.choices.length, 1, 'completion choices');
  const completionText = completion.choices[0].text;
  expectTrue(completionText.length > 0, 'completion text is empty');
  checkUsage(completion.usage, completion.choices[0].finish_reason, 'completion');
  if (expected.completion !== undefined) {
    expectEqual(completionText, expected.completion, 'completion text against rocmforge run --temp 0');
    expectEqual(completion.usage.prompt_tokens, expected.prompt_tokens, 'prompt_tokens against rocmforge tokenize');
  } else {
    const response = await fetch(new URL('../generate', `${baseURL.replace(/\/+$/, '')}/`), {
      method: 'POST',
      headers: { Authorization: `Bearer ${apiKey}` },
      body: JSON.stringify({ prompt: expected.prompt, max_tokens: expected.max_tokens, temperature: 0 }),
    });
    expectEqual(response.status, 200, 'status of the native /generate');
    expectEqual(completionText, (await response.json()).choices[0].text, 'completion text against /generate');
  }
  console.log(`ok   completions.create: ${JSON.stringify(completionText)} ${JSON.stringify(completion.usage)}`);

  const streamed = await readStream(
    await client.completions.create({ ...completionRequest, stream: true, stream_options: { include_usage: true } }),
    (choice) => choice.text,
  );
  expectEqual(streamed.text, completionText, 'streamed completion text');
  expectEqual(streamed.finishReason, completion.choices[0].finish_reason, 'streamed completion finish_reason');
  expectEqual(streamed.usage.completion_tokens, completion.usage.completion_tokens, 'streamed completion_tokens');
  expectEqual(streamed.usage.prompt_tokens, completion.usage.prompt_tokens, 'streamed prompt_tokens');
  for (const chunk of streamed.chunks) expectEqual(chunk.object, 'text_completion', 'streamed chunk.object');
  console.log(`ok   completions.create stream: ${streamed.chunks.length} chunks, same text and usage`);

  const chatRequest = {
    model,
    messages: [{ role: 'user', content: expected.message }],
    max_tokens: expected.max_tokens,
    temperature: 0,
  };
  const chat = await client.chat.completions.create(chatRequest);
  expectEqual(chat.object, 'chat.completion', 'chat.object');
  expectEqual(chat.choices.length, 1, 'chat choices');
  const reply = chat.choices[0].message;
  expectEqual(reply.role, 'assistant', 'chat message role');
  expectTrue(reply.content.length > 0, 'chat reply is empty');
  checkUsage(chat.usage, chat.choices[0].finish_reason, 'chat');
  if (expected.chat !== undefined) {
    expectEqual(reply.content, expected.chat, 'chat reply against rocmforge chat --temp 0');
    expectEqual(chat.usage.prompt_tokens, expected.chat_prompt_tokens, 'chat prompt_tokens against rocmforge tokenize');
  }
  console.log(`ok   chat.completions.create: ${JSON.stringify(reply.content)} ${JSON.stringify(chat.usage)}`);

  const chatStreamed = await readStream(
    await client.chat.completions.create({ ...chatRequest, stream: true, stream_options: { include_usage: true } }),
    (choice) => choice.delta.content,
  );
  expectEqual(chatStreamed.chunks[0].choices[0].delta.role, 'assistant', 'first chat chunk delta.role');
  expectEqual(chatStreamed.text, reply.content, 'streamed chat text');
  expectEqual(chatStreamed.finishReason, chat.choices[0].finish_reason, 'streamed chat finish_reason');
  expectEqual(chatStreamed.usage.completion_tokens, chat.usage.completion_tokens, 'streamed chat completion_tokens');
  expectEqual(chatStreamed.usage.prompt_tokens, chat.usage.prompt_tokens, 'streamed chat prompt_tokens');
  for (const chunk of chatStreamed.chunks) expectEqual(chunk.object, 'chat.completion.chunk', 'chat chunk.object');
  console.log(`ok   chat.completions.create stream: ${chatStreamed.chunks.length} chunks, same text and usage`);

  await expectError(
    () => client.completions.create({ ...completionRequest, temperature: -1 }),
    OpenAI.BadRequestError,
    400,
    { type: 'invalid_request_error', param: 'temperature' },
    'negative temperature',
  );
  await expectError(
    () => client.chat.completions.create({ ...chatRequest, messages: [] }),
    OpenAI.BadRequestError,
    400,
    { type: 'invalid_request_error', param: 'messages' },
    'empty messages',
  );
  await expectError(
    () => client.completions.create({ ...completionRequest, model: 'no-such-model' }),
    OpenAI.NotFoundError,
    404,
    { code: 'model_not_found', param: 'model' },
    'unknown model',
  );
  if (process.env.OPENAI_API_KEY) {
    const intruder = new OpenAI({ baseURL, apiKey: `${apiKey}-wrong`, maxRetries: 0 });
    await expectError(() => intruder.models.list(), OpenAI.AuthenticationError, 401, { code: 'invalid_api_key' },
      'wrong API key');
  }
  console.log('openai client check: all passed');
}

try {
  await main();
} catch (error) {
  // A mismatch says what differed, an unexpected API error its class and message; anything else (a connection error,
  // a bug here) shows whole.
  const what =
    error instanceof Mismatch ? error.message
    : error instanceof OpenAI.APIError ? `${error.constructor.name}: ${error.message}`
    : error.stack;
  console.error(`openai client check: FAIL: ${what}`);
  process.exit(1);
}
