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

  // The service page links each task to its page; an unknown task is not found.
  await page.locator(".crumbs a", { hasText: "ocr-preview" }).click();
  await expect(page.locator("table.tasks tr.state-stopped a").first()).toHaveAttribute("href", /^\/tasks\//);
  await open(page, "/tasks/no-such-task");
  await expect(page.locator(".error[role=alert]")).toContainText("no task no-such-task");
  expect(errors.filter((e) => !e.includes("404"))).toEqual([]);
});
