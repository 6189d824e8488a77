import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

// Pools administered in the browser: one added, then its settings changed, a value that
// is not a number named before it is sent and one the server refuses named by the server.
test("an admin adds a pool and changes its settings", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/hosts");
  const panel = page.getByRole("region", { name: "Pool settings" });
  const add = panel.getByRole("form", { name: "New pool" });
  await add.getByLabel("New pool").fill("Not A Name!");
  await add.getByRole("button", { name: "Add pool" }).click();
  await expect(add.locator(".field-error")).toBeVisible();
  await add.getByLabel("New pool").fill("lab");
  await add.getByRole("button", { name: "Add pool" }).click();
  await expect(panel.getByRole("status").filter({ hasText: "Pool lab added." })).toBeVisible();

  await open(page, "/hosts?pool=lab");
  const form = page.getByRole("form", { name: "Pool settings form" });
  await expect(page.getByRole("heading", { name: "Settings of pool lab" })).toBeVisible();
  await form.getByLabel("Compute overcommit").fill("lots");
  await form.getByRole("button", { name: "Save pool settings" }).click();
  await expect(form.locator(".field-error")).toContainText("must be a number from 1.0 to 10.0");
  await form.getByLabel("Compute overcommit").fill("20");
  await form.getByRole("button", { name: "Save pool settings" }).click();
  await expect(form.locator(".field-error")).toContainText("must be between 1.0 (caps reserved) and 10.0, got 20");
  await form.getByLabel("Compute overcommit").fill("1.5");
  await form.locator("select[name=policy]").selectOption("binpack");
  await form.locator("select[name=preemption]").selectOption("approve");
  await form.getByLabel("MPS client limit").fill("16");
  await form.getByRole("button", { name: "Save pool settings" }).click();
  await expect(page.getByRole("status").filter({ hasText: "Pool settings saved." })).toBeVisible();
  const lab = (await (await page.request.get("/api/v1/pools")).json()).pools.find((p: { name: string }) => p.name === "lab");
  expect(lab.policy).toBe("binpack");
  expect(lab.compute_overcommit).toBe(1.5);
  expect(lab.preemption).toBe("approve");
  expect(lab.mps_client_limit).toBe(16);
  await page.screenshot({ path: "screenshots/pool-settings.png", fullPage: true });
  expect(errors).toEqual([]);
});
