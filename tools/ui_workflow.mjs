// Turn an API-format graph into the UI-format workflow ComfyUI's editor saves, using the real
// frontend (so widget values, links and node sizes are exactly what the editor produces), and
// take a screenshot of it as the template thumbnail.
//
//   node tools/ui_workflow.mjs http://127.0.0.1:8188 api.json out.json out.jpg
//
// Needs a running ComfyUI with this pack and the demo's tiny files (tools/tiny_assets.py),
// Chromium and playwright-core (scripts/ui_deps.sh installs both).
import fs from "node:fs";
import path from "node:path";
import { openBrowser, openComfy } from "./chromium.mjs";

const [url, apiPath, outJson, outJpg] = process.argv.slice(2);
if (!outJpg) {
  console.error("usage: node tools/ui_workflow.mjs <comfyui url> <api.json> <out.json> <out.jpg>");
  process.exit(2);
}
const api = JSON.parse(fs.readFileSync(apiPath, "utf8"));
// Left to right in the order data flows: loaders; dataset and settings; training; save + run readers;
// test prompts; samplers; decode; outputs. Ids not in the graph are skipped.
// The thumbnail shows the first THUMB_COLUMNS columns (training and its results): template cards are
// nearly square, the whole graph is much wider than high.
const THUMB_COLUMNS = 4;
// The edit workflow's test input (23 LoadImage, 24 VAEEncode) and conditioning (25 ReferenceLatent,
// 26 FluxGuidance) sit between the test prompts and the samplers.
const COLUMNS = [["1", "2", "3"], ["4", "5", "6", "7"], ["8"], ["9", "19", "20"], ["21", "22"],
  ["10", "11", "12", "23", "24"], ["25", "26"], ["13", "16"], ["14", "17"], ["15", "18"]];
// Workflows whose ids mean other nodes. Best step: the eval set (24 Load Dataset, 25 Cache Latents) under
// the training set, Train Options (23) with the other settings, the LoRA Grid (13) beside the test sampler
// (15). Wan 2.2 experts: the low-noise loader (31) under the high-noise one, Wan 2.2 Experts (30) with the
// settings; two KSamplerAdvanced stages per test (13 then 16 with the LoRAs, 17 then 18 without).
const COLUMNS_OF = {
  train_pick_best_step: [["1", "2", "3"], ["4", "5", "24", "25"], ["6", "7", "23"], ["8"], ["9", "19", "20"],
    ["10", "11", "12"], ["13", "15"], ["14", "16"], ["17"]],
  train_wan22_experts_then_test: [["1", "31", "2", "3"], ["4", "5", "6", "7", "30"], ["8"], ["9", "19", "20"],
    ["10", "11", "12"], ["13", "17"], ["16", "18"], ["14", "21"], ["15", "22"]],
};

const browser = await openBrowser({ width: 2400, height: 1400 });
try {
  const { page } = browser;
  await openComfy(page, url);
  await page.evaluate(async (graph) => {
    await window.app.loadApiJson(graph.api, graph.name);
  }, { api, name: path.basename(outJson, ".json") });
  await page.waitForTimeout(500);
  const box = await page.evaluate(({ columns, thumbColumns }) => {
    const graph = window.app.graph;
    let x = 20;
    let thumbRight = 0;
    for (const [i, column] of columns.entries()) {
      let y = 40;
      let widest = 0;
      for (const id of column) {
        const node = graph.getNodeById(Number(id));
        if (!node) continue;
        node.pos = [x, y];
        y += node.size[1] + 60;
        widest = Math.max(widest, node.size[0]);
      }
      if (widest) x += widest + 50;
      if (i === thumbColumns - 1) thumbRight = x - 30;
    }
    // Test samplers keep their seed between queues, so re-running compares like with like.
    for (const node of graph._nodes) {
      for (const w of node.widgets ?? []) if (w.name === "control_after_generate") w.value = "fixed";
    }
    let right = 0;
    let bottom = 0;
    for (const node of graph._nodes) {
      right = Math.max(right, node.pos[0] + node.size[0]);
      bottom = Math.max(bottom, node.pos[1] + node.size[1]);
    }
    graph.setDirtyCanvas(true, true);
    return { right, bottom, thumbRight: thumbRight || right };
  }, { columns: COLUMNS_OF[path.basename(outJson, ".json")] ?? COLUMNS, thumbColumns: THUMB_COLUMNS });
  // Clear the view (banner, minimap), then fit the whole graph below the top bars and right of the sidebar.
  await page.locator("[data-testid=close-minmap-button], [data-testid=toggle-minimap-button]").first().click().catch(() => {});
  const view = { left: 70, top: 140, width: 2400 - 80, height: 1400 - 150 };
  const scale = await page.evaluate(({ box, view }) => {
    const ds = window.app.canvas.ds;
    ds.scale = Math.min(1, (view.width - 20) / box.thumbRight, (view.height - 20) / box.bottom);
    ds.offset = [(view.left + 10) / ds.scale, (view.top + 10) / ds.scale];
    window.app.graph.setDirtyCanvas(true, true);
    return ds.scale;
  }, { box, view });
  await page.waitForTimeout(500);
  const workflow = await page.evaluate(() => window.app.graph.serialize());
  fs.writeFileSync(outJson, JSON.stringify(workflow, null, 2) + "\n");
  await page.screenshot({ path: outJpg, type: "jpeg", quality: 80, clip: {
    x: view.left, y: view.top, width: Math.round(box.thumbRight * scale + 20),
    height: Math.round(box.bottom * scale + 20) } });
} finally {
  await browser.close();
}
