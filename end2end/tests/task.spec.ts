import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

// The on-call question "why did this task die?", answered from the overview: the demo's
// crash-looping service stands out, and its crash's last line is two clicks away.
test("a crash-looping service: from the overview to the crash's last line in two clicks", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/");
  const failing = page.getByRole("region", { name: "Failing services" });
  await expect(failing).toContainText("ocr-preview", { timeout: 60_000 });
  await expect(failing).toContainText("exit code 1");
  // Click 1: its latest failed task.
  await failing.locator("a.last-failed").first().click();
  await expect(page).toHaveURL(/\/tasks\/[0-9a-f-]{36}$/);
  await expect(page.locator("main[data-hydrated=true]")).toBeVisible();
  await expect(page.locator("h1")).toContainText("Task");
  await expect(page.locator(".badge.task-state")).toHaveText("stopped");
  await expect(page.getByRole("alert").filter({ hasText: "Crash-looping" })).toContainText("deployment #");
  await expect(page.locator("table.lifecycle tr.stopped")).toContainText("exit code 1");
  // Where it ran and what chose it, as said when it was placed.
  await expect(page.locator(".events")).toContainText("placed by pool inference's");
  // Click 2: its last lines.
  await page.getByRole("button", { name: "Show its last lines" }).click();
  const last = page.getByRole("region", { name: "Last lines" });
  await expect(last).toContainText("RuntimeError: CUDA error: out of memory");
  await expect(last).toContainText("loading weights from /models/ocr-v3");
  await page.screenshot({ path: "screenshots/task.png", fullPage: true });

  // Its logs, read from its host: every line in the order written, then how they ended;
  // a search keeps the lines holding its words.
  const logs = page.getByRole("region", { name: "Logs" });
  await logs.getByRole("button", { name: "Follow its logs" }).click();
  const lines = logs.locator("pre.log-lines");
  await expect(lines).toContainText("loading weights from /models/ocr-v3");
  await expect(lines).toContainText("RuntimeError: CUDA error: out of memory");
  await expect(logs.locator(".log-status")).toContainText("has ended", { timeout: 15_000 });
  await logs.getByLabel("Search").fill("runtimeerror");
  await expect(lines).not.toContainText("loading weights");
  await expect(lines).toContainText("RuntimeError");
  await expect(logs.getByRole("link", { name: "Download" })).toHaveAttribute("href", /\/logs\?timestamps=true$/);
  await page.screenshot({ path: "screenshots/task-logs.png", fullPage: true });

  // The service page links each task to its page; an unknown task is not found.
  await page.locator(".crumbs a", { hasText: "ocr-preview" }).click();
  await expect(page.locator("table.tasks tr.state-stopped a").first()).toHaveAttribute("href", /^\/tasks\//);
  const none = await page.request.get("/api/v1/tasks/no-such-task");
  expect(none.status()).toBe(404);
  expect((await none.json()).error).toContain("no task no-such-task");
  expect(errors).toEqual([]);
});

// An admin adds a webhook in the console: a bad URL is named beside its field, a good one
// is added with its secret shown once, and the deliveries of the demo's crash loop are
// listed with their status (the receiver here answers 405 to a POST: tried again, shown).
test("an admin adds a webhook and sees its deliveries with their status", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/notifications");
  const form = page.getByRole("form", { name: "Webhook" });
  await form.getByLabel("Name").fill("on-call");
  await form.getByLabel("URL").fill("ftp://example.com/hook");
  await form.getByRole("button", { name: "Add webhook" }).click();
  await expect(form.locator(".field-error")).toContainText("must be an http:// or https:// URL");
  await form.getByLabel("URL").fill(`${new URL(page.url()).origin}/healthz`);
  await form.getByLabel("task crash looping").check();
  await form.getByRole("button", { name: "Add webhook" }).click();
  await expect(page.getByRole("status")).toContainText("Webhook on-call added");
  await expect(page.locator(".minted pre code")).toHaveText(/^[0-9a-f]{64}$/);
  const hook = page.locator('section.webhook[data-webhook="on-call"]');
  await expect(hook).toContainText("json body to");
  await expect(hook).toContainText("task crash looping");
  // The demo's crash loop is said again as its failures grow: a delivery, refused, shown.
  await expect(hook.locator("tr.delivery").first()).toContainText("task crash looping", { timeout: 60_000 });
  await expect(hook.locator("tr.delivery td.reason").first()).toContainText("405", { timeout: 30_000 });
  await page.screenshot({ path: "screenshots/notifications.png", fullPage: true });
  const api = (await (await page.request.get("/api/v1/webhooks")).json()).webhooks;
  expect(api.map((w: { name: string }) => w.name)).toContain("on-call");
  expect(JSON.stringify(api)).not.toContain("secret");
  expect(errors).toEqual([]);
});
