import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

// Users and API tokens administered in the browser, with the API's rules and messages.
test("an admin adds a user, changes its role, disables it, and makes and deletes a token", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/users");
  const form = page.getByRole("form", { name: "New user" });
  await form.getByLabel("Username").fill("olga");
  await form.getByLabel("Password").fill("short");
  await form.getByRole("button", { name: "Add user" }).click();
  await expect(form.locator(".field-error")).toContainText("at least 12 characters");
  await form.getByLabel("Password").fill("a long enough password for olga");
  await form.locator("select[name=role]").selectOption("operator");
  await form.getByRole("button", { name: "Add user" }).click();
  await expect(page.getByRole("status").filter({ hasText: "User olga added" })).toContainText("operator");
  const row = page.locator('tr[data-user="olga"]');
  await expect(row.getByLabel("Role of olga")).toHaveValue("operator");
  // As the API sees it.
  let users = (await (await page.request.get("/api/v1/users")).json()).users;
  expect(users.find((u: { username: string }) => u.username === "olga").role).toBe("operator");
  await row.getByLabel("Role of olga").selectOption("viewer");
  await expect.poll(async () => {
    users = (await (await page.request.get("/api/v1/users")).json()).users;
    return users.find((u: { username: string }) => u.username === "olga").role;
  }).toBe("viewer");
  await row.getByRole("button", { name: "Disable" }).click();
  await expect(row).toContainText("disabled");
  await expect(row.getByRole("button", { name: "Enable" })).toBeVisible();
  // The last enabled admin stays: the server's refusal is shown.
  await page.locator('tr[data-user="admin"]').getByLabel("Role of admin").selectOption("viewer");
  await expect(page.getByRole("alert").filter({ hasText: "admin" }).first()).toBeVisible();

  // A token: a bad expiry named before it is sent, then made and shown once, then deleted.
  const tokens = page.getByRole("form", { name: "New API token" });
  await tokens.getByLabel("Name").fill("prometheus");
  await tokens.getByLabel("Expires in (days)").fill("soon");
  await tokens.getByRole("button", { name: "Make token" }).click();
  await expect(tokens.locator(".field-error")).toContainText("whole number of days");
  await tokens.getByLabel("Expires in (days)").fill("30");
  await tokens.getByRole("button", { name: "Make token" }).click();
  await expect(page.locator(".minted pre code")).toHaveText(/^\S{20,}$/);
  const token = page.locator("table.tokens tr", { hasText: "prometheus" });
  await expect(token).toContainText("viewer");
  await page.screenshot({ path: "screenshots/users.png", fullPage: true });
  await token.getByRole("button", { name: "Delete" }).click();
  await expect(page.locator("table.tokens tr", { hasText: "prometheus" })).toHaveCount(0);
  expect(errors).toEqual([]);
});
