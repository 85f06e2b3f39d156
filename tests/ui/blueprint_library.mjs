// The Train LoRA subgraph blueprint ("subgraphs/PipeTrain Train LoRA.json") in the real frontend, the way a user finds it:
// open the node search (double-click on the canvas), type its name, pick it; the canvas gets one subgraph node
// whose inner graph is the training chain, its nodes side by side once opened. Prints a JSON summary as the
// last stdout line for tests/e2e/test_subgraph_blueprint.py; screenshots go to <artifacts dir>.
//
//   node tests/ui/blueprint_library.mjs <comfyui url> <artifacts dir> <blueprint name>
import fs from "node:fs";
import path from "node:path";
import { openBrowser, openComfy } from "../../tools/chromium.mjs";

const [url, artifacts, name] = process.argv.slice(2);
fs.mkdirSync(artifacts, { recursive: true });
const browser = await openBrowser({ width: 1600, height: 1000 });
const summary = {};
try {
  const { page } = browser;
  await openComfy(page, url);
  await page.evaluate(() => window.app.loadGraphData({ last_node_id: 0, last_link_id: 0, nodes: [], links: [],
                                                        groups: [], config: {}, extra: {}, version: 0.4 }));
  await page.locator("[data-testid=close-minmap-button]").click({ timeout: 2000 }).catch(() => {});
  // Blueprints load after the app starts (GET /global_subgraphs): search until the entry shows.
  const input = page.locator(".comfy-vue-node-search-container input, [role=dialog] input[type=text]").first();
  const hit = page.locator("[role=option], .p-autocomplete-option").filter({ hasText: name }).first();
  // A double-click that opens no search (the page still busy on a loaded machine, a dialog in front) is
  // retried after Escape; only the deadline ends the search.
  const deadline = Date.now() + 90000;
  let found = false;
  while (!found && Date.now() < deadline) {
    await page.mouse.dblclick(800, 500);
    if (await input.waitFor({ timeout: 10000 }).then(() => true, () => false)) {
      await input.fill(name);
      found = await hit.waitFor({ timeout: 3000 }).then(() => true, () => false);
    }
    if (!found) await page.keyboard.press("Escape");
  }
  if (!found) {
    await page.screenshot({ path: path.join(artifacts, "blueprint_search_failed.png") });
    throw new Error(`the node search did not list ${name} within 90 s`);
  }
  summary.option = (await hit.textContent()).trim();
  await page.screenshot({ path: path.join(artifacts, "blueprint_search.png") });
  await hit.click();
  await page.waitForFunction(() => window.app.graph._nodes.length === 1, null, { timeout: 30000 });
  await page.waitForTimeout(500);
  Object.assign(summary, await page.evaluate(() => {
    const node = window.app.graph._nodes[0];
    const inner = node.subgraph?._nodes ?? [];
    return {
      title: node.title,
      isSubgraph: typeof node.isSubgraphNode === "function" && node.isSubgraphNode(),
      widgets: (node.widgets ?? []).map((w) => w.name),
      inputs: node.inputs.map((i) => i.name),
      outputs: node.outputs.map((o) => o.name),
      inner: inner.map((n) => n.type).sort(),
    };
  }));
  await page.screenshot({ path: path.join(artifacts, "blueprint_node.png") });
  // What the node queues after the user sets two of its inputs (the editor flattens it into the inner nodes).
  summary.queued = await page.evaluate(async () => {
    const node = window.app.graph._nodes[0];
    const set = (name, value) => { node.widgets.find((w) => w.name === name).value = value; };
    set("steps", 7);
    set("caption_prefix", "ohwx, ");
    const disabled = node.widgets.filter((w) => w.disabled || w.computedDisabled).map((w) => w.name);
    const { output } = await window.app.graphToPrompt();
    const byType = Object.fromEntries(Object.values(output).map((n) => [n.class_type, n.inputs]));
    return { disabled, steps: byType.PipeTrainTrainPipeline.steps, prefix: byType.PipeTrainLoadDataset.caption_prefix };
  });
  // Inside the node (what opening it shows): the training chain; no two nodes' boxes (title bar included)
  // overlap and each node's saved size fits its widgets (as tools/template_layout.mjs checks the templates).
  // Opened as a workflow of its own from the server's copy (GET /global_subgraphs/<id>), then entered.
  await page.evaluate(async (name) => {
    const listed = await (await fetch("global_subgraphs")).json();
    const [id] = Object.entries(listed).find(([, e]) => e.name === name && e.source === "custom_node");
    const { data } = await (await fetch(`global_subgraphs/${id}`)).json();
    await window.app.loadGraphData(JSON.parse(data));
    const node = window.app.graph._nodes[0];
    window.app.canvas.openSubgraph(node.subgraph, node);
  }, name);
  await page.waitForTimeout(800);
  Object.assign(summary, await page.evaluate(() => {
    const canvas = window.app.canvas;
    const title = window.LiteGraph.NODE_TITLE_HEIGHT;
    const nodes = canvas.graph._nodes;
    const boxes = nodes.map((n) => [n, n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title]);
    const overlaps = [];
    for (const [i, [a, ax, ay, aw, ah]] of boxes.entries()) {
      for (const [b, bx, by, bw, bh] of boxes.slice(i + 1)) {
        if (ax < bx + bw && bx < ax + aw && ay < by + bh && by < ay + ah) overlaps.push(`${a.type} / ${b.type}`);
      }
    }
    const tooSmall = nodes.filter((n) => { const [w, h] = n.computeSize(); return n.size[0] < w - 1 || n.size[1] < h - 1; })
      .map((n) => `${n.type} saved ${n.size.map(Math.round)} needs ${n.computeSize().map(Math.round)}`);
    const x0 = Math.min(...boxes.map((b) => b[1])) - 240; // the subgraph's input node sits left of the nodes
    const y0 = Math.min(...boxes.map((b) => b[2])) - 20;
    const x1 = Math.max(...boxes.map((b) => b[1] + b[3])) + 200;
    const y1 = Math.max(...boxes.map((b) => b[2] + b[4])) + 20;
    // The left part at a zoom that still draws the widgets' text (the frontend skips it below about 0.6).
    const [left, top, width, height] = [60, 130, 1600 - 60, 1000 - 130];
    const ds = canvas.ds;
    ds.scale = Math.max(0.62, Math.min(1, width / (x1 - x0), height / (y1 - y0)));
    ds.offset = [-x0 + left / ds.scale, -y0 + top / ds.scale];
    canvas.setDirty(true, true);
    return { opened: nodes.map((n) => n.type).sort(), overlaps, tooSmall };
  }));
  await page.waitForTimeout(800);
  await page.screenshot({ path: path.join(artifacts, "blueprint_inside.png") });
} finally {
  await browser.close();
}
console.log(JSON.stringify(summary));
