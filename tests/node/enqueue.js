// The Node.js recipe of docs/producers.md: enqueue usage inside the producer's own transaction
// with billing_outbox_enqueue(), so the event commits and rolls back with the work.
// Run by tests/outbox/test_sql_producers.py: node enqueue.js <scenario>; prints JSON lines.
const { Client } = require("pg");

async function enqueue(client, tenantId, quantity, key, meter = null, occurredAt = null) {
  const { rows } = await client.query(
    "SELECT billing_outbox_enqueue($1, $2, $3, $4, $5) AS id",
    [tenantId, quantity, key, meter, occurredAt]);
  return rows[0].id; // a bigint: pg returns it as a string
}

async function inTransaction(client, work) {
  await client.query("BEGIN");
  try {
    const result = await work();
    await client.query("COMMIT");
    return result;
  } catch (err) {
    await client.query("ROLLBACK");
    throw err;
  }
}

function report(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

async function main() {
  const client = new Client(); // PGHOST, PGPORT, PGUSER, PGDATABASE, PGOPTIONS from the env
  await client.connect();
  try {
    const committed = await inTransaction(client, async () => {
      // … the producer's own work here, then, in the same transaction:
      return enqueue(client, "acme", 5, "node:order-1");
    });
    report({ step: "committed", id: committed });
    try {
      await inTransaction(client, async () => {
        await enqueue(client, "acme", 5, "node:order-2");
        throw new Error("the work failed");
      });
    } catch (err) {
      report({ step: "rolled back", error: err.message });
    }
    report({ step: "duplicate", id: await enqueue(client, "acme", 5, "node:order-1") });
    for (const [label, args] of [
      ["conflict", ["acme", 6, "node:order-1"]],
      ["bad quantity", ["acme", 0, "node:bad-1"]],
      ["bad tenant", [" acme", 1, "node:bad-2"]],
      ["bad key", ["acme", 1, "clé"]],
      ["too old", ["acme", 1, "node:bad-3", null, new Date(Date.now() - 36 * 86400e3)]],
    ]) {
      try {
        await enqueue(client, ...args);
        report({ step: label, error: null });
      } catch (err) {
        report({ step: label, sqlstate: err.code, column: err.column || null, message: err.message });
      }
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  process.stderr.write(String(err.stack || err) + "\n");
  process.exit(1);
});
