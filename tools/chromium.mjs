// Start Debian's Chromium through playwright-core the way PipeTrain's browser tools and tests do:
// headless, no sandbox/GPU/network extras, and a fresh profile folder that is deleted afterwards.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

export const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];

function executable() {
  const candidates = [process.env.PIPETRAIN_CHROMIUM, "/usr/bin/chromium", "/usr/bin/chromium-browser"].filter(Boolean);
  const found = candidates.find((p) => fs.existsSync(p));
  if (!found) throw new Error("Chromium not found: run scripts/ui_deps.sh (apt-get install chromium) or set PIPETRAIN_CHROMIUM");
  return found;
}

/** A browser context with a fresh --user-data-dir; close() also removes the profile. */
export async function openBrowser({ width = 1900, height = 1100 } = {}) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "pipetrain-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: executable(),
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width, height },
  });
  const page = context.pages()[0] || (await context.newPage());
  return {
    context,
    page,
    async close() {
      await context.close().catch(() => {});
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Open ComfyUI and wait until its app and graph exist. */
export async function openComfy(page, url) {
  await page.goto(url);
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph, null, { timeout: 90000 });
}
