// Open each UI-format example workflow in the real frontend, the way a user does, and print what the
// editor would queue for it (app.graphToPrompt) plus any node type the frontend does not know.
// tests/e2e/test_example_workflows.py compares the result with the workflow's API twin.
//
//   node tests/ui/workflow_prompts.mjs <comfyui url> <workflow.json>...
import fs from "node:fs";
import path from "node:path";
import { openBrowser, openComfy } from "../../tools/chromium.mjs";

const [url, ...files] = process.argv.slice(2);
const browser = await openBrowser();
const result = {};
try {
  const { page } = browser;
  await openComfy(page, url);
  for (const file of files) {
    const workflow = JSON.parse(fs.readFileSync(file, "utf8"));
    result[path.basename(file, ".json")] = await page.evaluate(async (wf) => {
      await window.app.loadGraphData(wf);
      const unknown = window.app.graph._nodes.filter((n) => !window.LiteGraph.registered_node_types[n.type])
        .map((n) => n.type);
      const { output } = await window.app.graphToPrompt();
      return { unknown, output };
    }, workflow);
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
