// The MCP TypeScript SDK's Client enabling a toolset at run time, for tests/e2e: it connects over
// stdio (argv: "stdio", command, ...args) or streamable HTTP (argv: "http", url), calls
// `toolsets enable=compat`, waits for notifications/tools/list_changed, lists tools again, calls
// the new tool and enables it a second time; it prints one JSON line of what it saw.
// Run with `npx -y -p @modelcontextprotocol/sdk@VERSION -- node ts_toolsets_client.cjs ...`: the
// SDK is found through the `node_modules/.bin` entry npx puts on PATH.
const path = require("path");
const fs = require("fs");
const { createRequire } = require("module");

const bin = (process.env.PATH || "")
  .split(path.delimiter)
  .find((dir) => fs.existsSync(path.join(dir, "..", "@modelcontextprotocol", "sdk")));
if (!bin) throw new Error("run me through npx -p @modelcontextprotocol/sdk");
const sdk = createRequire(path.join(bin, "..", "resolve-from-here.js"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = sdk("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { ToolListChangedNotificationSchema } = sdk("@modelcontextprotocol/sdk/types.js");

async function main() {
  const [mode, target, ...rest] = process.argv.slice(2);
  const transport =
    mode === "stdio"
      ? new StdioClientTransport({ command: target, args: rest, env: process.env, stderr: "inherit" })
      : new StreamableHTTPClientTransport(new URL(target));
  const client = new Client({ name: "ts-toolsets-probe", version: "1.0.0" });
  let changes = 0;
  let heard;
  const heardOne = new Promise((resolve) => (heard = resolve));
  client.setNotificationHandler(ToolListChangedNotificationSchema, async () => {
    changes += 1;
    heard();
  });
  await client.connect(transport);
  const names = async () => (await client.listTools()).tools.map((tool) => tool.name);
  const before = await names();
  const enabled = await client.callTool({ name: "toolsets", arguments: { enable: "lmcache" } });
  const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error("no list_changed")), 20000));
  await Promise.race([heardOne, timeout]);
  const after = await names();
  const stats = await client.callTool({ name: "lmcache_status", arguments: {} });
  const again = await client.callTool({ name: "toolsets", arguments: { enable: "lmcache" } });
  console.log(
    JSON.stringify({
      list_changed_declared: client.getServerCapabilities()?.tools?.listChanged === true,
      before,
      after,
      enabled: enabled.structuredContent,
      changes,
      stats_error: stats.isError === true,
      stats: stats.structuredContent,
      again_error: again.isError === true,
      again_text: again.content.map((block) => block.text).join(" "),
    }),
  );
  await client.close();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
