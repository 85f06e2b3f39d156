// Measure every node of the given workflows as each of the frontend's renderers draws it: the classic canvas
// (LiteGraph) and, where the frontend has it, "Nodes 2.0" (Vue nodes, setting Comfy.VueNodes.Enabled, which
// grows a node to its content). Each workflow is loaded and then shown a result in every node that shows one,
// as tests/ui/browser_train.mjs does (tools/template_layout.mjs). Prints JSON:
// { "<renderer>:<file name>": { "<node id>": [width, height] } }, the larger of the two moments; read by
// tools/relayout_templates.py.
//
//   node tools/measure_templates.mjs <comfyui url> <image file name in input/<subfolder>> <subfolder> workflow.json ...
import fs from "node:fs";
import path from "node:path";
import { openBrowser, openComfy } from "./chromium.mjs";
import { checkTemplateInPage, hasNodes2InPage, setNodes2InPage } from "./template_layout.mjs";

const [url, imageName, subfolder, ...files] = process.argv.slice(2);
const TRAIN_ID = 8; // the example workflows' Train Pipeline node
const image = { filename: imageName, subfolder, type: "input" };
const browser = await openBrowser({ width: 1700, height: 1200 });
try {
  const { page } = browser;
  await openComfy(page, url);
  const hasNodes2 = await page.evaluate(hasNodes2InPage);
  const result = {};
  for (const nodes2 of hasNodes2 ? [false, true] : [false]) {
    await page.evaluate(setNodes2InPage, nodes2);
    for (const file of files) {
      const workflow = JSON.parse(fs.readFileSync(file, "utf8"));
      const { loaded, after } = await page.evaluate(checkTemplateInPage, { workflow, image, trainId: TRAIN_ID, nodes2 });
      result[`${nodes2 ? "nodes2" : "classic"}:${path.basename(file)}`] = Object.fromEntries(Object.keys(loaded.sizes).map(
        (id) => [id, [0, 1].map((i) => Math.max(loaded.sizes[id][i], after.sizes[id]?.[i] ?? 0))]));
    }
  }
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
}
