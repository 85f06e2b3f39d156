// Take each example workflow's thumbnail (example_workflows/<name>.jpg, the picture ComfyUI's template browser
// shows) from the workflow as it is saved: loaded in the real frontend, its first THUMB_COLUMNS columns of nodes
// (training and its results), at a zoom that still draws the widgets' text (the window is sized to fit them), cut
// to a square at the top (template cards are nearly square), below the top bars and right of the sidebar, the
// minimap and the canvas info closed. The workflow files are not changed.
//
//   node tools/template_thumbnails.mjs <comfyui url> workflow.json ...      (tools/relayout_templates.py --thumbnails)
import fs from "node:fs";
import { openBrowser, openComfy } from "./chromium.mjs";

const THUMB_COLUMNS = 4;
const SCALE = 0.7; // LiteGraph leaves text out below about 0.6
const [url, ...files] = process.argv.slice(2);
const view = { left: 70, top: 140 }; // the canvas part no panel covers

const browser = await openBrowser({ width: 2400, height: 1400 });
try {
  const { page } = browser;
  await openComfy(page, url);
  for (const file of files) {
    const workflow = JSON.parse(fs.readFileSync(file, "utf8"));
    await page.evaluate(async (wf) => { await window.app.loadGraphData(wf); }, workflow);
    await page.locator("[data-testid=close-minmap-button]").first().click({ timeout: 2000 }).catch(() => {});
    const part = await page.evaluate((columns) => {
      const { app } = window;
      const title = window.LiteGraph.NODE_TITLE_HEIGHT;
      const xs = [...new Set(app.graph._nodes.map((n) => n.pos[0]))].sort((a, b) => a - b).slice(0, columns);
      const shown = app.graph._nodes.filter((n) => xs.includes(n.pos[0]));
      const x0 = Math.min(...shown.map((n) => n.pos[0])) - 20;
      const y0 = Math.min(...shown.map((n) => n.pos[1] - title)) - 20;
      const x1 = Math.max(...shown.map((n) => n.pos[0] + n.size[0])) + 20;
      const y1 = Math.max(...shown.map((n) => n.pos[1] + n.size[1])) + 20;
      return { x0, y0, width: x1 - x0, height: y1 - y0 };
    }, THUMB_COLUMNS);
    // at most square (the card's shape): the top of the columns, where the loaders, training and results are
    const width = Math.round(part.width * SCALE);
    const box = { width, height: Math.min(width, Math.round(part.height * SCALE)) };
    // the canvas controls at the window's bottom edge stay below the picture
    await page.setViewportSize({ width: view.left + box.width + 20, height: view.top + box.height + 120 });
    await page.evaluate(({ part, view, scale }) => {
      const { app } = window;
      app.canvas.show_info = false;
      app.canvas.ds.scale = scale;
      app.canvas.ds.offset = [view.left / scale - part.x0, view.top / scale - part.y0];
      app.graph.setDirtyCanvas(true, true);
    }, { part, view, scale: SCALE });
    await page.waitForTimeout(800);
    const jpg = file.replace(/\.json$/, ".jpg");
    await page.screenshot({ path: jpg, type: "jpeg", quality: 80,
      clip: { x: view.left, y: view.top, width: box.width, height: box.height } });
    console.log(`wrote ${jpg} (${box.width}x${box.height})`);
  }
} finally {
  await browser.close();
}
