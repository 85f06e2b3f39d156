// Turn an API-format graph into the UI-format workflow ComfyUI's editor saves, using the real
// frontend (so widget values, links and node sizes are exactly what the editor produces), and
// take a screenshot of it as the template thumbnail.
//
//   node tools/ui_workflow.mjs http://127.0.0.1:8188 api.json out.json out.jpg
//
// Needs a running ComfyUI with this pack, Debian's chromium and `npm i playwright-core`.
import fs from "node:fs";
import { chromium } from "playwright-core";

const [url, apiPath, outJson, outJpg] = process.argv.slice(2);
const api = JSON.parse(fs.readFileSync(apiPath, "utf8"));
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1900, height: 1000 } });
  await page.goto(url);
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 60000 });
  await page.evaluate(async (graph) => {
    await window.app.loadApiJson(graph, "train_lora_then_test");
  }, api);
  // Lay the nodes out left to right in the order data flows: loaders, dataset, training, test.
  await page.evaluate((columns) => {
    const byId = (id) => window.app.graph.getNodeById(Number(id));
    columns.forEach((column, x) => {
      let y = 40;
      for (const id of column) {
        const node = byId(id);
        if (!node) continue;
        node.pos = [[20, 330, 720, 1060, 1450, 1780, 2020][x], y];
        y += node.size[1] + 60;
      }
    });
    // Test samplers keep their seed between queues, so re-running compares like with like.
    for (const node of window.app.graph._nodes) {
      for (const w of node.widgets ?? []) if (w.name === "control_after_generate") w.value = "fixed";
    }
    window.app.graph.setDirtyCanvas(true, true);
  }, [["1", "2", "3"], ["4", "5", "6", "7"], ["8"], ["9", "10", "11", "12"], ["13", "16"], ["14", "17"], ["15", "18"]]);
  await page.waitForTimeout(500);
  await page.evaluate(() => {
    window.app.canvas.ds.scale = 0.64;
    window.app.canvas.ds.offset = [40, 190];
    window.app.graph.setDirtyCanvas(true, true);
  });
  await page.waitForTimeout(300);
  const workflow = await page.evaluate(() => window.app.graph.serialize());
  fs.writeFileSync(outJson, JSON.stringify(workflow, null, 2) + "\n");
  await page.screenshot({ path: outJpg, type: "jpeg", quality: 80, clip: { x: 60, y: 120, width: 1800, height: 640 } });
} finally {
  await browser.close();
}
