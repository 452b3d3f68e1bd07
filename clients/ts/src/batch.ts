// SPDX-License-Identifier: Apache-2.0

// Coalescing (IdemClientOptions.coalesce): the begins, or the completes,
// that a client is asked for in one turn of Node's event loop go to idemsvc
// as one batch call (POST /v1/begin/batch, POST /v1/finish/batch), each
// item exactly the body of its single call, so that a busy service pays
// one HTTP exchange, and idemsvc one request, for many calls. A batch's
// results are taken only when they are successes: any other item, and
// every item of a batch that failed as a whole, is sent again as its own
// single call, whose answer (problem, Retry-After, retries) is then the
// call's. Sending an item again is safe: a begin carries its owner, so a
// begin the batch did acquire gets the same lease back, and a complete its
// lease token, so a complete the batch did store answers the same again.

/** What a batch call answered: its HTTP status and body. */
export interface BatchReply {
  status: number;
  body: Buffer;
}

/** Sends one batch call: POST path with body, bounded by ms. */
export type BatchSend = (path: string, body: string, ms: number) => Promise<BatchReply>;

/** The most items in one batch: idemsvc's default IDEMSVC_MAX_BATCH. */
const MAX_ITEMS = 100;
/** The most bytes of items in one batch, well under idemsvc's 2 MiB request bodies. */
const MAX_BATCH_CHARS = 256 << 10;
/** A call whose body is larger goes alone: a large response gains nothing from company. */
export const MAX_ITEM_CHARS = 16 << 10;

interface Item<T> {
  /** The item's JSON in the batch. */
  json: string;
  /** When (Date.now()) the item's call is due to end. */
  deadline: number;
  /** The item's single call, made when the batch does not answer for it. */
  alone: () => Promise<T>;
  resolve: (value: T) => void;
  reject: (err: unknown) => void;
}

/** The calls of one kind waiting for the end of this turn of the event loop, and how to send them. */
export class Batcher<T> {
  private queue: Item<T>[] = [];
  /** Set when idemsvc refuses batches (an older one, or a smaller IDEMSVC_MAX_BATCH): every call then goes alone. */
  private off = false;

  constructor(
    private readonly path: string,
    private readonly send: BatchSend,
  ) {}

  /** Whether calls still go in batches. */
  get on(): boolean {
    return !this.off;
  }

  /** The call whose batch item is json, answered by the batch, or by alone when the batch cannot. */
  add(json: string, deadline: number, alone: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      // The queue is sent once the I/O of this turn is handled: every call
      // made meanwhile joins it, and a lone call waits for nothing else.
      if (this.queue.length === 0) setImmediate(this.flush);
      this.queue.push({ json, deadline, alone, resolve, reject });
    });
  }

  private readonly flush = (): void => {
    const queue = this.queue;
    this.queue = [];
    let start = 0;
    let chars = 0;
    for (let i = 0; i < queue.length; i++) {
      const n = queue[i]!.json.length + 1;
      if (i > start && (i - start === MAX_ITEMS || chars + n > MAX_BATCH_CHARS)) {
        this.sendBatch(queue.slice(start, i));
        start = i;
        chars = 0;
      }
      chars += n;
    }
    this.sendBatch(start === 0 ? queue : queue.slice(start));
  };

  private sendBatch(items: Item<T>[]): void {
    if (items.length === 1 || this.off) return items.forEach(alone);
    let deadline = items[0]!.deadline;
    for (const item of items) if (item.deadline < deadline) deadline = item.deadline;
    const ms = deadline - Date.now();
    if (ms <= 0) return items.forEach(alone);
    let body = '{"items":[';
    for (let i = 0; i < items.length; i++) body += i === 0 ? items[i]!.json : ',' + items[i]!.json;
    body += ']}';
    this.send(this.path, body, ms).then(
      (reply) => this.answer(items, reply),
      () => items.forEach(alone),
    );
  }

  private answer(items: Item<T>[], reply: BatchReply): void {
    if (reply.status !== 200) {
      // 400: more items than idemsvc's batches hold; 404 or 405: an idemsvc
      // without batches. Either way, every call goes alone from now on.
      if (reply.status === 400 || reply.status === 404 || reply.status === 405) this.off = true;
      return items.forEach(alone);
    }
    let results: unknown;
    try {
      results = (JSON.parse(reply.body.toString()) as { results?: unknown }).results;
    } catch {
      results = undefined;
    }
    if (!Array.isArray(results) || results.length !== items.length) return items.forEach(alone);
    for (let i = 0; i < items.length; i++) {
      const result = results[i] as { status?: unknown; body?: unknown } | null;
      const status = result?.status;
      if (typeof status === 'number' && status >= 200 && status < 300 && typeof result!.body === 'object' && result!.body !== null) {
        items[i]!.resolve(result!.body as T);
      } else {
        alone(items[i]!);
      }
    }
  }
}

function alone<T>(item: Item<T>): void {
  item.alone().then(item.resolve, item.reject);
}
